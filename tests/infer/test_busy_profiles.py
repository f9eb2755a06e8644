"""Profiles measured while other processes keep the CPUs busy serve their process but are not cached."""

import os
import subprocess
import sys
import time

import pytest
from infer_helpers import make_drafter

from dspark_lightning import load_drafter
from dspark_lightning.checkpoint import save_drafter
from dspark_lightning.infer import load_or_profile
from dspark_lightning.infer.profiling import busy, measure_draft_cost, measure_sps
from dspark_lightning.infer.profiling.measure_draft_cost import load_or_profile_draft_cost

pytestmark = pytest.mark.skipif(not busy._STAT.is_file(), reason="reads Linux's /proc/stat")


def test_other_processes_cpu_time_is_measured_and_ours_is_not():
    n = os.cpu_count() or 1
    spin = "import sys, time\nprint(flush=True)\nend = time.time() + 4\nwhile time.time() < end: pass"
    spinners = [subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE) for _ in range(n)]
    try:
        for p in spinners:
            p.stdout.readline()  # spinning from here on
        with busy.OtherLoad() as others:
            time.sleep(1.0)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    assert others.share is not None and others.share > 0.5, others.share  # every CPU spun for others

    with busy.OtherLoad() as own:  # this process's own work is not "others"
        end = time.process_time() + 0.5
        while time.process_time() < end:
            pass
    assert own.share is not None and own.share < others.share


def test_a_busy_profile_serves_its_process_and_is_not_cached(tiny_target, varied_target, tmp_path, monkeypatch,
                                                             capsys):  # fmt: skip
    monkeypatch.setenv("DSPARK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(busy, "BUSY_SHARE", 0.0)  # any share counts as busy
    for module in (measure_sps, measure_draft_cost):
        monkeypatch.setattr(module, "_BUSY", {})
    save_drafter(make_drafter(varied_target, "dspark", block_size=3), tmp_path / "d", varied_target)
    drafter = load_drafter(tmp_path / "d", varied_target)

    table = load_or_profile(tiny_target, context_len=16, max_tokens=2, progress=True)
    cost = load_or_profile_draft_cost(varied_target, drafter, max_batch=1, progress=True)
    assert table.meta["others_cpu_share"] is not None and cost.meta["others_cpu_share"] is not None
    assert not list((tmp_path / "cache").rglob("*.json"))  # nothing cached: not the SPS table, cost, kernel choice
    out = capsys.readouterr().out
    for what in ("the SPS table", "the drafter's cost", "the matrix-kernel choice"):
        assert f"{what} was measured: it serves this process and is not cached" in out
    assert load_or_profile(tiny_target, context_len=16, max_tokens=2, progress=True) is table  # kept in the process
    assert load_or_profile_draft_cost(varied_target, drafter, max_batch=1, progress=True) is cost
    assert "was measured" not in capsys.readouterr().out

    monkeypatch.setattr(busy, "BUSY_SHARE", 1.01)  # a quiet machine, a new process
    for module in (measure_sps, measure_draft_cost):
        monkeypatch.setattr(module, "_BUSY", {})
    kept = load_or_profile(tiny_target, context_len=16, max_tokens=2, progress=False)
    assert kept is not table and len(list((tmp_path / "cache" / "sps").glob("*.json"))) == 1
    kept_cost = load_or_profile_draft_cost(varied_target, drafter, max_batch=1, progress=False)
    assert len(list((tmp_path / "cache" / "sps" / "draft_cost").glob("*.json"))) == 1
    assert load_or_profile_draft_cost(varied_target, drafter, max_batch=1, progress=False).seconds == kept_cost.seconds
