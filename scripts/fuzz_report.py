"""Run the bad-input table of issue 14 (tests/e2e/fuzz_cases.py) in subprocesses and count the outcomes.

    python scripts/fuzz_report.py                                   # this checkout
    PYTHONPATH=/tmp/old_checkout python scripts/fuzz_report.py      # another checkout's code, the same table

Each case runs in a fresh copy of the workspace with a timeout (a case that runs past it is a hang) and is classified
as a clean rejection (exit 2, a one-line ``dspark-lightning [<cmd>]: error:`` last), a messy one (exit 2, but usage
text, a multi-line message or a progress bar last), a traceback, a hang or silent (exit 0); cases that changed a
pre-existing file are counted too. The test suite
(tests/e2e/test_fuzz.py) runs the same table in-process; this script is for the before/after figures.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN = "import json, sys; from dspark_lightning.cli import main; main(json.load(sys.stdin))"  # argv on stdin: a
# 200 k-character prompt is longer than the OS allows one command-line argument to be


def _load_table():
    spec = importlib.util.spec_from_file_location("fuzz_cases", ROOT / "tests" / "e2e" / "fuzz_cases.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_case(fz, workspace: Path, scratch: Path, case: tuple[str, list[str]], timeout: float) -> dict:
    """One case in its own copy of the workspace -> ``{"id", "outcome", "changed", "last_line"}``."""
    name, argv = case
    work = scratch / name.replace("/", "_")
    shutil.copytree(workspace, work)
    before = fz.snapshot(work)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    try:
        proc = subprocess.run([sys.executable, "-c", RUN], input=json.dumps(fz.argv_for(argv)), cwd=work, env=env,
                              capture_output=True, text=True, timeout=timeout)  # fmt: skip
        code, err = proc.returncode, proc.stderr
    except subprocess.TimeoutExpired as exc:
        code, err = None, exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    result = {"id": name, "outcome": fz.classify(code, err), "changed": fz.changed(before, fz.snapshot(work))}
    shutil.rmtree(work, ignore_errors=True)
    return result | {"exit": code, "last_line": lines[-1][:200] if lines else ""}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per case before it counts as a hang")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", default="", help="run the cases whose id contains this, or ids listed comma-separated")
    ap.add_argument("--json", default=None, help="also write every case's result here")
    a = ap.parse_args()
    fz = _load_table()
    ids = set(a.only.split(",")) if "," in a.only else None
    cases = [c for c in fz.CASES if (c[0] in ids if ids else a.only in c[0])]
    with tempfile.TemporaryDirectory(prefix="fuzz-") as tmp:
        workspace = fz.make_workspace(Path(tmp) / "workspace")
        with ThreadPoolExecutor(a.jobs) as pool:
            results = list(pool.map(lambda c: run_case(fz, workspace, Path(tmp), c, a.timeout), cases))
    counts = Counter(r["outcome"] for r in results)
    for r in results:
        if r["outcome"] != "clean" or r["changed"]:
            print(f"{r['outcome']:9s} {r['id']}: exit {r['exit']}: {r['last_line']}" + (
                f" (changed {r['changed']})" if r["changed"] else ""))  # fmt: skip
    modified = sum(bool(r["changed"]) for r in results)
    print(f"cases {len(results)} | clean rejections {counts['clean']} | messy rejections {counts['messy']} | "
          f"tracebacks {counts['traceback']} | hangs {counts['hang']} (> {a.timeout:g} s) | silent {counts['silent']} "
          f"| changed a pre-existing file {modified}")  # fmt: skip
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
