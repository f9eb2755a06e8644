"""scripts/gpu_check.py runs on the device machine, where nothing can be fixed mid-run: its code paths run here, on
the CPU, and on a CUDA device when there is one (``gpu`` marker).

The quick mode uses the same checks (bf16 greedy equality, χ² at T = 1, prepare + a bf16-mixed fit, decode()
against HF generate(), syncs per round, the SPS profile) on tiny shapes; a failure in any of them is a failed row
and exit code 1.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_gpu_check_quick(tmp_path, device):
    out = tmp_path / "out"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--device", device, "--dtype", "bf16", "--quick",
           "--out", str(out)]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    report = json.loads((out / "gpu_check.json").read_text())
    rows = report["rows"]
    kinds = ["greedy", "χ²", "fit", "tok/s", "syncs", "SPS"]
    assert [next(k for k in kinds if r["check"].startswith(k)) for r in rows] == kinds, rows
    failed = [r for r in rows if not r["ok"]]
    assert not failed, failed
    assert run.returncode == 0, run.stderr[-2000:]
    table = (out / "gpu_check.md").read_text()
    assert table.count("| PASS |") == len(rows) and report["run"]["dtype"] == "bf16"
    syncs = next(r for r in rows if r["check"].startswith("syncs"))
    assert "HostReads" in syncs["detail"] and "verify" in syncs["detail"]
