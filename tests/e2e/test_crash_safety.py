"""Crash safety: `fit` killed with SIGKILL after the feature stage and mid-training resumes with
`--ckpt_path last` from the checkpoint's step and exports a finite drafter; divergence stops `fit` with exit 2;
stale caches and orphans of killed writes are handled."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dspark_lightning.data.features.cache import cache_meta, write_cache
from dspark_lightning.lightning.datamodule import DSparkDataModule

from .conftest import TINY, run_main

SMALL = ["--data.features=cached", "--validate_before_fit=false", "--trainer.limit_val_batches=1"]
CHECKPOINT_EVERY_STEP = """
trainer:
  callbacks:
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {save_last: true, every_n_train_steps: 1}
"""


def spawn(cwd: Path, *args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "dspark_lightning.cli", "fit", "--config", TINY, "--config", "ckpt.yaml", *SMALL]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    log = cwd / f"run-{time.monotonic_ns()}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([*cmd, *args], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
    proc.log = log
    return proc


def kill_when(proc: subprocess.Popen, ready, timeout: float = 120) -> None:
    """SIGKILL ``proc`` as soon as ``ready()`` holds (it must not finish first)."""
    end = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, f"fit ended (rc {proc.returncode}) before it could be killed"
        assert time.monotonic() < end, "timed out waiting to kill fit"
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def test_fit_killed_after_features_and_mid_training_resumes(workdir, capsys):
    """The workdir holds the regenerated responses (online features): the first run extracts the feature cache."""
    from dspark_lightning import load_drafter

    tmp_path = workdir
    (tmp_path / "ckpt.yaml").write_text(CHECKPOINT_EVERY_STEP)
    work = tmp_path / "outputs" / "tiny_debug" / "data"
    # 1. killed right after the feature stage: the merged train cache exists, no checkpoint yet
    kill_when(spawn(tmp_path, "--trainer.max_steps=200"), lambda: (work / "features_train" / "index.json").is_file())
    code, _, err = run_main(["fit", "--config", TINY, "--config", "ckpt.yaml", *SMALL, "--ckpt_path", "last"], capsys)
    last = err.splitlines()[-1]
    assert code == 2 and last.startswith("dspark-lightning") and "error: --ckpt_path last: no checkpoint" in last
    # 2. a fresh run reuses the features, and is killed once it has written a checkpoint
    ckpts = tmp_path / "outputs" / "tiny_debug" / "tb"
    kill_when(spawn(tmp_path, "--trainer.max_steps=200"), lambda: any(ckpts.glob("*/checkpoints/*step=*.ckpt")))
    step = max(int(re.search(r"step=(\d+)", p.name).group(1)) for p in ckpts.glob("*/checkpoints/*step=*.ckpt"))
    # 3. --ckpt_path last resumes that run at its step and finishes two steps later
    proc = spawn(tmp_path, f"--trainer.max_steps={step + 2}", "--ckpt_path", "last")
    assert proc.wait(timeout=120) == 0, proc.log.read_text()[-3000:]
    log = proc.log.read_text()
    assert "reusing prepared data" in log  # the features the first killed run wrote
    assert f"restored the checkpoint of step {step} " in log
    export = Path(re.search(r"exported drafter -> (\S+)", log).group(1))
    assert json.loads((export.parent / "fit_stats.json").read_text())["steps"] == step + 2
    drafter = load_drafter(tmp_path / export)
    assert all(torch.isfinite(v).all() for v in drafter.state_dict().values() if v.is_floating_point())
    assert not list(work.rglob("*.tmp-*")) and not list(tmp_path.rglob(".*export-tmp-*"))


def test_divergence_stops_fit_with_one_line(workdir, capsys):
    args = ["fit", "--config", TINY, "--trainer.max_steps=4", "--validate_before_fit=false", "--model.optim.lr=1e30"]
    code, _, err = run_main(args, capsys)
    assert code == 2 and "non-finite training loss" in err and "diverged" in err
    assert not list(workdir.glob("outputs/tiny_debug/tb/*/drafter"))


@pytest.mark.parametrize("arg", ["--model.loss.decay=0", "--model.optim.lr=.inf", "--model.loss.l1_weight=.nan"])
def test_invalid_hyperparameters_exit_2_before_any_work(tmp_path, monkeypatch, capsys, arg):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_main(["fit", "--config", TINY, "--trainer.max_steps=2", arg], capsys)
    assert code == 2 and err.startswith("dspark-lightning") and len(err.splitlines()) == 1
    assert not (tmp_path / "outputs").exists()


def test_stale_data_gets_a_new_fingerprint(tmp_path):
    def fingerprint(**kw) -> str:
        base = {
            "target": "tiny-debug",
            "work_dir": str(tmp_path),
            "sources": [{"class_path": "humaneval", "init_args": {"limit": 4}}],
        }
        return DSparkDataModule(**{"heldout_fraction": 0.5, **base, **kw}).prepare_job().fingerprint

    prompts = tmp_path / "p.jsonl"
    rows = [{"id": str(i), "turns": [f"question {i}"]} for i in range(8)]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    jsonl = [{"class_path": "jsonl", "init_args": {"path": str(prompts)}}]
    ref, ref_jsonl = fingerprint(), fingerprint(sources=jsonl)
    assert ref == fingerprint()
    changed = [
        fingerprint(sources=[{"class_path": "humaneval", "init_args": {"limit": 5}}]),
        fingerprint(max_length=512),
        fingerprint(min_supervised=3),
        fingerprint(target={"name": "tiny-debug", "dtype": "bf16"}),
        fingerprint(feature_dtype="float32"),
        fingerprint(seed=7),
    ]
    assert ref not in changed and len(set(changed)) == len(changed)
    rows[3]["turns"] = ["question 3, edited"]  # same ids, other content
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert fingerprint(sources=jsonl) != ref_jsonl


def test_cache_write_removes_orphans_of_a_killed_write(tiny_target, tmp_path):
    out = tmp_path / "features_train"
    for orphan in (tmp_path / "features_train.tmp-killed", tmp_path / "features_train.old-killed"):
        orphan.mkdir()
        (orphan / "shard-000000.tar").write_bytes(b"half")
    (tmp_path / "features_other.tmp-x").mkdir()  # another cache's: untouched
    out_ = tiny_target(torch.arange(6)[None])
    sample = {"id": "s", "input_ids": torch.arange(6), "loss_mask": torch.ones(6)}
    sample.update(context=out_.context[0].float(), hidden=out_.hidden[0].float())
    with pytest.warns(UserWarning, match="interrupted feature cache write"):
        write_cache([sample], out, cache_meta(tiny_target, "float32"), progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["features_other.tmp-x", "features_train"]
