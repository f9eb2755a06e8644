"""The cases the generated classes reach only in part: a real closed pipe on stdout, Ctrl-C in the
middle of training, regeneration bounded by the target's positions, a read-only output folder."""

from __future__ import annotations

import json
import logging

import pytest

from dspark_lightning.data.prompts.sources import PromptRecord
from dspark_lightning.data.regen.regenerate import regenerate
from dspark_lightning.testing import random_target

from .conftest import TINY, run_main
from .test_fuzz_harness import Case, debris, run_subprocess


def test_decode_into_a_closed_pipe_is_one_line(tmp_path):
    """``dspark-lightning decode ... | head -c1`` in a real process: one line, exit 2, nothing after it (the
    interpreter's last flush goes to /dev/null)."""
    case = Case("stdout", "pipe", ["decode", "--target", "tiny-debug", "--prompt", "hi", "--max_new_tokens", "8"],
                stdout="pipe")  # fmt: skip
    res = run_subprocess(case, tmp_path, timeout=120)
    assert res["outcome"] == "clean" and res["exit"] == 2, res
    assert "standard output was closed" in res["last_line"]


def test_ctrl_c_during_training_is_one_line_and_leaves_no_debris(workdir, capsys, monkeypatch):
    from dspark_lightning import locks
    from dspark_lightning.lightning.module import DSparkModule

    calls = []
    real = DSparkModule.training_step

    def step(self, *a, **k):
        calls.append(1)
        if len(calls) > 2:
            raise KeyboardInterrupt
        return real(self, *a, **k)

    monkeypatch.setattr(DSparkModule, "training_step", step)
    monkeypatch.setattr(logging, "raiseExceptions", False)
    (workdir / "ckpt.yaml").write_text(
        "trainer:\n  callbacks:\n    - class_path: lightning.pytorch.callbacks."
        "ModelCheckpoint\n      init_args: {save_last: true, every_n_train_steps: 1}\n"
    )
    args = ["fit", "--config", TINY, "--config", "ckpt.yaml", "--validate_before_fit=false", "--trainer.max_steps=6"]
    import signal

    handler = signal.getsignal(signal.SIGINT)
    try:
        code, _, err = run_main(args, capsys)
    finally:
        signal.signal(signal.SIGINT, handler)  # Lightning ignores SIGINT after a KeyboardInterrupt
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 130 and lines[-1].startswith("dspark-lightning fit: interrupted (Ctrl-C)"), err[-2000:]
    assert "Traceback" not in err and len(calls) == 3
    assert not debris(workdir) and not locks._held  # the folder locks went with the command
    ckpts = list(workdir.rglob("*.ckpt"))
    assert ckpts, "the checkpoints of the two steps before Ctrl-C are kept"
    from dspark_lightning.lightning.checkpoint_io import checkpoint_problem

    assert all(checkpoint_problem(p) is None for p in ckpts)


@pytest.mark.parametrize("backend", ["dspark", "hf"])
def test_regeneration_is_bounded_by_the_targets_positions(tmp_path, backend, caplog):
    target = random_target(layers=2, max_position_embeddings=40)
    recs = [PromptRecord("p/1", "chat", "t", ["hi"]), PromptRecord("p/2", "chat", "t", ["tell me " * 12])]
    with pytest.raises(ValueError, match="leaves no room for a prompt in the 40 positions"):
        regenerate(target, recs, tmp_path / "x.jsonl", max_new_tokens=40, progress=False, backend=backend)
    assert not (tmp_path / "x.jsonl").exists()
    out = tmp_path / "r.jsonl"
    with caplog.at_level(logging.WARNING):
        st = regenerate(target, recs, out, max_new_tokens=39, temperature=0.0, progress=False, backend=backend)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    for row in rows:
        prompt = target.encode_prompt([m for m in row["turns"] if m["role"] == "user"][:1])
        assert len(prompt) + row["gen"]["new_tokens"][0] <= 40, row["gen"]
    assert st["written"] + st["dropped_empty"] == 2 and "cut to the target's 40 positions" in caplog.text


def test_a_read_only_output_folder_is_refused_up_front(tmp_path, capsys, monkeypatch):
    """Checked before the model loads (root passes chmod, so os.access is what the check reads: emulate it)."""
    import os

    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, m, *a, **k: False if str(p).startswith(str(ro)) and m & os.W_OK
                        else real(p, m, *a, **k))  # fmt: skip
    for args in (["decode", "--prompt", "hi", "--json_out", str(ro / "r.json")],
                 ["profile", "--target", "tiny-debug", "--out", str(ro / "sps.json")],
                 ["fit", "--config", TINY, f"--trainer.default_root_dir={ro / 'run'}"]):  # fmt: skip
        code, _, err = run_main(args, capsys)
        last = err.strip().splitlines()[-1]
        assert code == 2 and str(ro) in last and "not writable" in last, err[-2000:]
    assert os.listdir(ro) == []
