"""A disk that fills while a command writes: the command ends with one line naming the path and the space it needs,
and the previous file or folder is byte-identical, with no temp debris. Checkpoints: a full disk mid-save keeps the
previous one, the run resumes once space is freed, and ``--ckpt_path last`` skips a truncated checkpoint."""

import json
import os
import re

import pytest
import torch

from dspark_lightning import create, load_target
from dspark_lightning.calibration import Rollouts
from dspark_lightning.checkpoint import save_drafter
from dspark_lightning.checkpoint.calibration import calibration_file

from .conftest import TINY, run_main


@pytest.fixture
def drafter_dir(tmp_path):
    target = load_target("tiny-debug")
    torch.manual_seed(0)
    d = create(
        "drafter", "dspark", target, block_size=3, backbone={"class_path": "dense", "init_args": {"num_layers": 1}}
    )
    return save_drafter(d, tmp_path / "drafters" / "dspark", target)


def one_line_error(code: int, err: str, path) -> str:
    last = err.strip().splitlines()[-1]
    assert code == 2 and last.startswith("dspark-lightning") and "error: no space left on the device" in last, err
    assert str(path) in last and "free" in last
    return last


def listing(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("fmt", ["native", "dspark-hf"])
def test_export_overwrite_on_a_full_disk_keeps_the_previous_export(drafter_dir, tmp_path, capsys, disk_full, snapshot,
                                                                   fmt):  # fmt: skip
    serving = tmp_path / "serving"
    out = serving / fmt
    args = ["export", "--drafter", str(drafter_dir), "--layout", fmt, "--out", str(out), "--dtype", "fp32"]
    code, _, err = run_main(args, capsys)
    assert code == 0, err
    before, names = snapshot(serving), listing(serving)
    disk = disk_full(serving, room=2000)  # the weights do not fit
    code, _, err = run_main([*args, "--overwrite", "true"], capsys)
    one_line_error(code, err, out)
    assert disk.hits >= 1 and snapshot(serving) == before and listing(serving) == names
    disk.free()
    assert run_main([*args, "--overwrite", "true"], capsys)[0] == 0  # space freed: the same command succeeds


def test_calibrate_on_a_full_disk_keeps_the_previous_calibration(drafter_dir, tmp_path, capsys, disk_full, snapshot):
    g = torch.Generator().manual_seed(0)
    n = 600  # 16 prompts x 3 domains (the defaults), half held out
    Rollouts(torch.randn(n, 3, generator=g).double(), torch.randint(0, 4, (n,), generator=g),
             torch.full((n,), 3), torch.arange(n) % 48, torch.rand(n, 3, generator=g).double() * 4,
             ).save(tmp_path / "rollouts.pt")  # fmt: skip
    args = ["calibrate", "--drafter", str(drafter_dir), "--rollouts", str(tmp_path / "rollouts.pt")]
    args += ["--min_rows", "10", "--min_class", "1"]
    code, _, err = run_main(args, capsys)
    assert code == 0, err[-2000:]
    cal = drafter_dir / calibration_file(1.0)
    assert cal.is_file()
    before, names = snapshot(drafter_dir.parent), listing(drafter_dir.parent)
    disk_full(drafter_dir, room=1000)
    code, _, err = run_main(args, capsys)
    one_line_error(code, err, cal)
    assert snapshot(drafter_dir.parent) == before and listing(drafter_dir.parent) == names
    json.loads(cal.read_text())  # still whole: the drafter loads its calibration


def test_decode_json_out_on_a_full_disk_keeps_the_previous_file(tmp_path, capsys, disk_full):
    out = tmp_path / "res" / "r.json"
    out.parent.mkdir()
    out.write_text('{"previous": true}\n')
    disk_full(out.parent)
    args = ["decode", "--target", "tiny-debug", "--prompt", "hello", "--max_new_tokens", "4", "--json_out", str(out)]
    code, _, err = run_main(args, capsys)
    one_line_error(code, err, out)
    assert out.read_text() == '{"previous": true}\n' and os.listdir(out.parent) == ["r.json"]


@pytest.mark.parametrize("command,first", [("eval", "tau_table.json"), ("bench", "bench.json")])
def test_eval_and_bench_outputs_on_a_full_disk_keep_the_previous_files(drafter_dir, tmp_path, capsys, disk_full,
                                                                       command, first):  # fmt: skip
    out = tmp_path / command
    out.mkdir()
    (out / first).write_text("previous\n")
    disk_full(out)
    args = [command, "--drafter", f"d={drafter_dir}", "--prompts_per_domain", "1", "--domains", "math"]
    args += ["--max_new_tokens", "3", "--out", str(out)]
    if command == "bench":
        args += ["--batches", "1", "--repeats", "1", "--scheduler", "static"]
    code, _, err = run_main(args, capsys)
    one_line_error(code, err, out / first)
    assert os.listdir(out) == [first] and (out / first).read_text() == "previous\n"


CHECKPOINTS = """
trainer:
  logger: false
  callbacks:
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {dirpath: ckpts, save_last: true, every_n_train_steps: 1}
"""
FIT = ["fit", "--config", TINY, "--config", "ckpt.yaml", "--validate_before_fit=false", "--trainer.limit_val_batches=1"]


def test_checkpoint_on_a_full_disk_then_resume_then_a_truncated_last(workdir, capsys, disk_full, snapshot):
    (workdir / "ckpt.yaml").write_text(CHECKPOINTS)
    ckpts = workdir / "ckpts"

    def fit(steps: int, run: str, *extra: str):
        args = [*FIT, f"--trainer.max_steps={steps}", f"--trainer.default_root_dir=runs/{run}", *extra]
        return run_main(args, capsys)  # a root dir per run: config.yaml and the export are per run, ckpts/ shared

    code, _, err = fit(2, "a")
    assert code == 0, err[-3000:]
    before = snapshot(ckpts)
    assert "last.ckpt" in before and not os.path.islink(ckpts / "last.ckpt")
    # 1. the disk fills while step 3's checkpoint is written: one line, the previous checkpoints untouched
    disk = disk_full(ckpts, room=4096)
    code, _, err = fit(4, "b", "--ckpt_path", "last")
    last = one_line_error(code, err, ckpts)
    assert re.search(r"ckpts/\S+\.ckpt", last) and snapshot(ckpts) == before  # hidden temp files included
    # 2. space freed: --ckpt_path last resumes from step 2
    disk.free()
    code, out, err = fit(4, "c", "--ckpt_path", "last")
    assert code == 0, err[-3000:]
    assert "restored the checkpoint of step 2 " in out
    # 3. a truncated newest last.ckpt (a copy that broke off): the newest readable one is used, said in one line
    data = (ckpts / "last.ckpt").read_bytes()
    (ckpts / "last.ckpt").write_bytes(data[: len(data) // 2])
    newest = max(p.stat().st_mtime_ns for p in ckpts.glob("*.ckpt")) + 10**9
    os.utime(ckpts / "last.ckpt", ns=(newest, newest))
    code, out, err = fit(5, "d", "--ckpt_path", "last")
    assert code == 0, err[-3000:]
    note = [ln for ln in out.splitlines() if "skipping unreadable" in ln]
    assert len(note) == 1 and "last.ckpt" in note[0] and "step=4.ckpt" in note[0]
    assert "restored the checkpoint of step 4 " in out
    # 4. nothing readable: a one-line error, not a traceback deep in torch.load
    for p in ckpts.glob("*.ckpt"):
        p.write_bytes(b"PK\x03\x04" + b"\x00" * 64)
    code, _, err = fit(6, "e", "--ckpt_path", "last")
    assert code == 2 and "no readable checkpoint" in err.strip().splitlines()[-1]


def test_an_export_killed_midway_does_not_block_the_next(drafter_dir, tmp_path, capsys):
    """A kill leaves only a hidden temp folder beside --out (never a half --out): the next export, without
    --overwrite, removes it and succeeds."""
    out = tmp_path / "serving" / "hf"
    orphan = tmp_path / "serving" / ".hf.export-tmp-999999999-killed"
    orphan.mkdir(parents=True)
    (orphan / "model.safetensors").write_bytes(b"\x00" * 10)
    code, _, err = run_main(
        ["export", "--drafter", str(drafter_dir), "--layout", "dspark-hf", "--out", str(out)], capsys
    )
    assert code == 0, err[-2000:]
    assert listing(tmp_path / "serving") == ["hf", "hf/config.json", "hf/model.safetensors"]


def test_write_prompts_on_a_full_disk_keeps_its_files_whole_and_resumes(tmp_path, capsys, disk_full, snapshot):
    folder = tmp_path / "prompts"
    out, raw = folder / "p.jsonl", folder / "p.jsonl.raw.jsonl"
    folder.mkdir()
    args = ["write-prompts", "--target", "tiny-debug", "--max_new_tokens", "4", "--out", str(out)]
    assert run_main([*args, "--n", "3"], capsys)[0] == 0
    before = snapshot(folder)
    disk = disk_full(folder)
    code, _, err = run_main([*args, "--n", "6"], capsys)  # 3 more replies to append: no room
    one_line_error(code, err, raw)
    assert disk.hits >= 1 and snapshot(folder) == before  # no half row, the prompt file as it was
    disk.free()
    assert run_main([*args, "--n", "6"], capsys)[0] == 0  # resumes: the 3 written rows are kept, 3 added
    assert [json.loads(x)["id"] for x in raw.read_text().splitlines()] == [f"self_chat/s0/{i}" for i in range(6)]
