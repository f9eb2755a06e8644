"""Profiles measured while other processes keep the CPUs busy serve their call but are not cached."""

import os
import subprocess
import sys
import time

import pytest
from infer_helpers import make_drafter

from dspark_lightning.infer import load_or_profile
from dspark_lightning.infer.profiling import busy
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


def test_a_busy_profile_serves_its_call_and_is_not_kept(tiny_target, varied_target, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DSPARK_CACHE", str(tmp_path))
    monkeypatch.setattr(busy, "BUSY_SHARE", 0.0)  # any share counts as busy
    table = load_or_profile(tiny_target, context_len=16, max_tokens=2, progress=True)
    assert table.meta["others_cpu_share"] is not None and not list((tmp_path / "sps").rglob("*.json"))
    drafter = make_drafter(varied_target, "dspark", block_size=3)
    first = load_or_profile_draft_cost(varied_target, drafter, max_batch=1, progress=True)
    again = load_or_profile_draft_cost(varied_target, drafter, max_batch=1, progress=True)
    assert again is not first  # measured again
    out = capsys.readouterr().out
    assert "the SPS table was measured: it serves this call and is not cached" in out
    assert "the matrix-kernel choice was measured" in out and not list((tmp_path / "kernels").glob("*"))
    assert out.count("the drafter's cost was measured") == 2

    monkeypatch.setattr(busy, "BUSY_SHARE", 1.01)  # a quiet machine
    kept = load_or_profile(tiny_target, context_len=16, max_tokens=2, progress=False)
    assert len(list((tmp_path / "sps").glob("*.json"))) == 1
    assert load_or_profile(tiny_target, context_len=16, max_tokens=2, progress=False).raw_sps == kept.raw_sps
    third = load_or_profile_draft_cost(varied_target, drafter, max_batch=1, progress=False)
    assert load_or_profile_draft_cost(varied_target, drafter, max_batch=1, progress=False) is third
