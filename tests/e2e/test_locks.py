"""One writer per folder: ``fit``, ``prepare`` and ``calibrate`` refuse a folder another live process holds, naming
it, and take over the lock of a killed one (the kernel drops a ``flock`` with its process)."""

import os
import signal
import socket
import subprocess
import sys

import pytest
import torch

from dspark_lightning import create, load_target, locks
from dspark_lightning.checkpoint import save_drafter

from .conftest import TINY, run_main

HOLD = "import sys, time; from dspark_lightning import locks; locks.acquire(sys.argv[1], 'fit'); print('locked', flush=True); time.sleep(300)"  # noqa: E501


@pytest.fixture
def holder():
    """``holder(folder)``: a live process holding ``folder``'s lock (killed at the end of the test)."""
    procs = []

    def start(folder) -> subprocess.Popen:
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True, env=env)
        procs.append(proc)
        assert proc.stdout.readline().strip() == "locked"
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_a_second_holder_is_refused_and_a_killed_ones_lock_taken_over(tmp_path, holder):
    folder = tmp_path / "run"
    proc = holder(folder)
    with pytest.raises(locks.FolderLockedError) as info:
        locks.acquire(folder, "prepare")
    msg = str(info.value)
    assert f"pid {proc.pid} on host {socket.gethostname()}" in msg and "started 20" in msg and "\n" not in msg
    assert str(folder) in msg and "`fit`" in msg
    os.kill(proc.pid, signal.SIGKILL)  # a stale lock: its process is gone
    proc.wait()
    with locks.folder_lock(folder, "prepare"):
        assert locks.holder(folder)["pid"] == os.getpid()
        with locks.folder_lock(folder, "prepare"):  # re-entrant within a process (fit prepares its own data)
            pass
        assert locks.holder(folder)["pid"] == os.getpid()  # still held after the inner block
    assert locks.holder(folder) is None  # released: no stale holder record


def test_fit_and_prepare_refuse_a_folder_another_run_holds(workdir, capsys, holder):
    data = workdir / "outputs" / "tiny_debug" / "data"
    proc = holder(data)
    code, _, err = run_main(["prepare", "--config", TINY], capsys)
    last = err.strip().splitlines()[-1]
    assert code == 2 and last.startswith("dspark-lightning prepare: error:") and f"pid {proc.pid}" in last
    assert "in use by `fit`" in last and "outputs/tiny_debug/data is in use" in last
    root = holder(workdir / "outputs" / "tiny_debug")  # fit locks its root dir (and the work dir)
    code, _, err = run_main(["fit", "--config", TINY, "--trainer.max_steps=1", "--validate_before_fit=false"], capsys)
    last = err.strip().splitlines()[-1]
    assert code == 2 and last.startswith("dspark-lightning fit: error:") and f"pid {root.pid}" in last
    assert not list((workdir / "outputs" / "tiny_debug").glob("*/version_*"))  # refused before any work


def test_calibrate_refuses_a_drafter_another_calibrate_holds(tmp_path, capsys, holder):
    target = load_target("tiny-debug")
    torch.manual_seed(0)
    d = save_drafter(create("drafter", "dspark", target, block_size=3), tmp_path / "d", target)
    proc = holder(d)
    code, _, err = run_main(["calibrate", "--drafter", str(d), "--prompts_per_domain", "1"], capsys)
    last = err.strip().splitlines()[-1]
    assert code == 2 and "calibrate: error:" in last and f"pid {proc.pid}" in last
    assert not list(d.glob("calibration_T*.json"))


def test_write_prompts_refuses_an_output_folder_another_run_holds(tmp_path, capsys, holder):
    proc = holder(tmp_path)
    out = tmp_path / "prompts.jsonl"
    code, _, err = run_main(["write-prompts", "--target", "tiny-debug", "--n", "2", "--out", str(out)], capsys)
    last = err.strip().splitlines()[-1]
    assert code == 2 and "write-prompts: error:" in last and f"pid {proc.pid}" in last
    assert not out.exists() and not (tmp_path / "prompts.jsonl.raw.jsonl").exists()
