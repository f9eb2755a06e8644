"""``dspark-lightning eval`` and ``bench`` end to end on the tiny target: every documented file, with its schema."""

import json

import pytest
import torch

from dspark_lightning import create, load_target
from dspark_lightning.checkpoint import save_drafter
from dspark_lightning.eval.bench import OUTPUT_FILES as BENCH_FILES
from dspark_lightning.eval.runner import OUTPUT_FILES as EVAL_FILES

from .conftest import run_main


@pytest.fixture(scope="module")
def drafters(tmp_path_factory):
    """Random exported drafters of both families (parallel block, chain) for tiny-debug."""
    root = tmp_path_factory.mktemp("drafters")
    target = load_target("tiny-debug")
    torch.manual_seed(0)
    dspark = create(
        "drafter", "dspark", target, block_size=3, backbone={"class_path": "dense", "init_args": {"num_layers": 1}}
    )
    mtp = create("drafter", "mtp1", target)
    return {"dspark": save_drafter(dspark, root / "dspark", target), "mtp1": save_drafter(mtp, root / "mtp1", target)}


def test_eval_writes_every_file(drafters, tmp_path, capsys):
    extra = tmp_path / "mine.jsonl"
    extra.write_text('{"turns": ["Name three colours."]}\n{"turns": ["Count to five.", "Now backwards."]}\n')
    out = tmp_path / "eval"
    args = ["eval", "--drafter", f"dspark={drafters['dspark']}", "--drafter+", str(drafters["mtp1"])]
    args += ["--prompts_per_domain", "2", "--max_new_tokens", "6", "--dataset", f"mine={extra}:chat"]
    code, stdout, err = run_main(args + ["--out", str(out)], capsys)
    assert code == 0, err[-2000:]
    assert sorted(p.name for p in out.iterdir()) == sorted(EVAL_FILES)
    doc = json.loads((out / "tau_table.json").read_text())
    names = ["gsm_symbolic", "humaneval", "mtbench", "mine"]
    assert [d["name"] for d in doc["datasets"]] == names and doc["datasets"][3]["domain"] == "chat"
    assert all(d["prompts"] == 2 for d in doc["datasets"])
    assert set(doc["tau"]) == {"dspark", "mtp1"}  # an unnamed drafter is named after its registered kind
    for n, top in (("dspark", 4.0), ("mtp1", 2.0)):
        assert all(1.0 <= doc["tau"][n][d] <= top for d in names)
        assert doc["macro_tau"][n] == pytest.approx(sum(doc["tau"][n].values()) / 4)
        assert doc["domain_tau"][n]["chat"] == pytest.approx((doc["tau"][n]["mtbench"] + doc["tau"][n]["mine"]) / 2)
        assert all(doc["speedup_vs_plain"][n][d] > 0 for d in names)
    assert doc["info"]["temperature"] == 1.0 and doc["info"]["seed"] == 980406  # the paper's defaults
    acc = json.loads((out / "acceptance.json").read_text())
    assert len(acc["dspark"]["humaneval"]["conditional_acceptance"]) == 3
    assert len(acc["mtp1"]["mine"]["survival"]) == 1
    assert "| dspark |" in (out / "tau_table.md").read_text() and "macro" in stdout
    assert (out / "acceptance.png").read_bytes()[:4] == b"\x89PNG"


def test_eval_rejects_an_empty_dataset(drafters, tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    args = ["eval", "--drafter", str(drafters["dspark"]), "--dataset", f"alpaca={empty}", "--out", str(tmp_path / "o")]
    code, _, err = run_main(args + ["--prompts_per_domain", "1", "--domains", "math"], capsys)
    assert code == 2 and "alpaca" in err and "no prompts" in err


def test_bench_writes_every_file(drafters, tmp_path, capsys):
    out = tmp_path / "bench"
    args = ["bench", "--drafter", f"[dspark={drafters['dspark']},mtp1={drafters['mtp1']}]"]
    args += ["--prompts_per_domain", "2", "--max_new_tokens", "4", "--batches", "[1,2]", "--repeats", "2"]
    code, _, err = run_main(args + ["--scheduler", "static", "--out", str(out)], capsys)
    assert code == 0, err[-2000:]
    assert sorted(p.name for p in out.iterdir()) == sorted(BENCH_FILES)
    doc = json.loads((out / "bench.json").read_text())
    rows = doc["rows"]
    decoders = ["HF generate", "HF prompt lookup", "plain decode(), HF forward", "plain decode()", "dspark", "mtp1"]
    cells = {(r["temperature"], r["batch"], r["prompt_set"]) for r in rows}
    assert cells == {(T, 1, d) for T in (0.0, 1.0) for d in ("math", "code", "chat")} | {
        (0.0, 2, "all"),
        (1.0, 2, "all"),
    }
    assert len(rows) == len(cells) * len(decoders)
    for r in rows:
        if r["decoder"] == "HF prompt lookup" and r["batch"] > 1:
            assert r["tok_s"] is None and r["note"].startswith("unsupported")  # HF assisted generation is batch-1 only
            continue
        assert r["tok_s"] > 0 and len(r["runs_tok_s"]) == 2
        assert r["speedup_vs_hf"] == pytest.approx(r["tok_s"] / next(
            x["tok_s"] for x in rows if x["decoder"] == "HF generate" and x["prompt_set"] == r["prompt_set"]
            and (x["temperature"], x["batch"]) == (r["temperature"], r["batch"])))  # fmt: skip
        if r["decoder"] in ("dspark", "mtp1"):
            assert r["efficiency"] == pytest.approx(r["speedup_vs_plain"] / r["tau"])
            assert 0 <= r["skipped_steps"] <= r["steps"] and set(r["ms_per_step"]) == {"draft", "verify", "accept"}
        if r["temperature"] == 0 and r["batch"] == 1 and r["decoder"] != "HF generate":
            assert r["equals_hf"] is True  # every decoder reproduces HF greedy decoding
    assert (out / "bench.png").read_bytes()[:4] == b"\x89PNG"
    assert "| 0 | 1 | math | dspark |" in (out / "bench.md").read_text()


def test_bench_adds_coupled_rows_at_t_above_zero(drafters, tmp_path, capsys):
    out = tmp_path / "bench"
    args = ["bench", "--drafter", f"dspark={drafters['dspark']}", "--prompts_per_domain", "1", "--domains", "math"]
    args += ["--max_new_tokens", "4", "--batches", "1", "--repeats", "1", "--acceptance", "[rejection,coupled]"]
    code, _, err = run_main(args + ["--scheduler", "static", "--out", str(out)], capsys)
    assert code == 0, err[-2000:]
    rows = json.loads((out / "bench.json").read_text())["rows"]
    coupled = {(r["temperature"], r["decoder"]) for r in rows if r["decoder"].endswith("[coupled]")}
    assert coupled == {(1.0, "plain decode() [coupled]"), (1.0, "dspark [coupled]")}  # none at T = 0 (greedy)
    by = {(r["temperature"], r["decoder"]): r for r in rows}
    assert by[(1.0, "dspark [coupled]")]["tau"] >= 1 and by[(1.0, "dspark [coupled]")]["tok_s"] > 0
    code, _, err = run_main(args[:-2] + ["--acceptance", "gumbel", "--out", str(tmp_path / "x")], capsys)
    assert code != 0 and "--acceptance" in err
