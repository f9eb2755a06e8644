"""SPS tables and profiling, the decode/profile commands, and the Lightning-free import."""

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from dspark_lightning.cli import main
from dspark_lightning.infer import (
    HardwareAwareScheduler,
    HardwareProfile,
    SPSTable,
    load_or_profile,
    measure_hardware,
    profile_sps,
)
from dspark_lightning.infer.schedule.sps import nonincreasing


def test_table_interpolates_and_rejects_beyond_profile(tmp_path):
    t = SPSTable.from_points({1: 10.0, 3: 6.0, 7: 2.0}, target="x")
    assert torch.allclose(
        t(torch.tensor([1.0, 2.0, 3.0, 5.0, 7.0])), torch.tensor([10.0, 8, 6, 4, 2], dtype=torch.float64)
    )
    assert float(t(8)) == 0.0  # above the profiled maximum: inadmissible
    back = SPSTable.load(t.save(tmp_path / "t.json"))
    assert back.tokens == t.tokens and back.sps == t.sps and back.meta == {"target": "x"}


def test_nonincreasing_smoothing():
    raw = [10.0, 6.0, 7.0, 5.0, 5.5, 5.5, 2.0]
    s = nonincreasing(raw)
    assert (torch.tensor(s).diff() <= 0).all()
    assert s[0] == 10.0 and s[1] == s[2] == 6.5 and s[-1] == 2.0
    assert sum(s) == pytest.approx(sum(raw))  # pooling keeps the mean of each violating run


def test_profile_and_cache_per_target(tiny_target, tmp_path, monkeypatch):
    monkeypatch.setenv("DSPARK_CACHE", str(tmp_path))
    table = profile_sps(tiny_target, grid=(1, 2, 4, 8), context_len=16, repeats=2, warmup=1, progress=False)
    assert table.tokens == [1, 2, 4, 8] and all(s > 0 for s in table.raw_sps)
    assert (torch.tensor(table.sps).diff() <= 0).all()
    assert table.meta["target"] == "tiny-debug" and table.meta["context_len"] == 16
    first = load_or_profile(tiny_target, context_len=16, max_tokens=4, progress=False)
    files = list((tmp_path / "sps").glob("*.json"))
    assert len(files) == 1 and "tiny-debug" in files[0].name
    again = load_or_profile(tiny_target, context_len=16, max_tokens=4, progress=False)  # from the cache
    assert again.raw_sps == first.raw_sps
    sched = HardwareAwareScheduler(context_len=16, include_draft_time=False)
    engine = SimpleNamespace(hardware=HardwareProfile(), scheduler=sched, proposer=object(), block_size=3)
    profile = measure_hardware(engine, tiny_target, None, max_requests=1, progress=False)  # B up to 1 * (3 + 1)
    assert profile.sps.raw_sps == first.raw_sps and profile.draft_cost is None  # read from the cache
    sched.use_hardware(profile)
    assert sched.sps is profile.sps and sched.needs_hardware() == frozenset()
    engine.proposer = None  # plain decoding reads nothing
    assert measure_hardware(engine, tiny_target, None, max_requests=1, progress=False) is engine.hardware


def test_decode_command_streams_and_writes_json(tmp_path, capsys):
    out = tmp_path / "r.json"
    main(
        [
            "decode",
            "--target",
            "tiny-debug",
            "--prompt",
            "hello",
            "--max_new_tokens",
            "6",
            "--scheduler",
            "static",
            "--json_out",
            str(out),
        ]
    )
    err = capsys.readouterr().err
    assert "plain decoding, greedy: tau 1.000" in err
    res = json.loads(out.read_text())
    assert len(res["token_ids"][0]) == 6 and res["stats"]["generated_tokens"] == 6


def test_decode_command_with_drafter_and_prompt_file(tiny_target, tmp_path, capsys):
    from infer_helpers import make_drafter

    from dspark_lightning.checkpoint import save_drafter

    save_drafter(make_drafter(tiny_target, block_size=3), tmp_path / "d", tiny_target)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"turns": ["one"]}\n{"turns": ["two two"]}\n{"turns": ["three"]}\n')
    main(
        [
            "decode",
            "--target",
            "tiny-debug",
            "--drafter",
            str(tmp_path / "d"),
            "--prompts",
            str(prompts),
            "--limit",
            "2",
            "--max_new_tokens",
            "5",
            "--scheduler",
            "{class_path: threshold, init_args: {threshold: 0.0}}",
        ]
    )
    cap = capsys.readouterr()
    assert cap.out.count("--- [") == 2
    assert "scheduler threshold" in cap.err and "mean l 3.00" in cap.err


def test_decode_command_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["decode", "--target", "tiny-debug"])
    assert e.value.code == 2 and "--prompt" in capsys.readouterr().err


def test_profile_command(tmp_path, capsys):
    main(
        [
            "profile",
            "--target",
            "tiny-debug",
            "--out",
            str(tmp_path / "s.json"),
            "--plot",
            str(tmp_path / "s.png"),
            "--max_tokens",
            "4",
            "--context_len",
            "8",
            "--repeats",
            "1",
        ]
    )
    table = SPSTable.load(tmp_path / "s.json")
    assert table.tokens == [1, 2, 3, 4] and (tmp_path / "s.png").stat().st_size > 1000


def test_infer_imports_without_lightning():
    code = (
        "import sys, dspark_lightning.infer as i, dspark_lightning.cli; "
        "from dspark_lightning import load_target; "
        "i.decode(load_target('tiny-debug'), None, [[1, 2, 3]], max_new_tokens=2); "
        "bad = [m for m in sys.modules if m == 'lightning' or m.startswith(('lightning.', 'pytorch_lightning'))]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={"HF_HUB_OFFLINE": "1", "PATH": ""}, timeout=300)
