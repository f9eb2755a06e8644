"""Run the bad-input table of issue 14 (tests/e2e/fuzz_cases.py), or issue 20's generated classes, in subprocesses
and count the outcomes.

    python scripts/fuzz_report.py                                   # this checkout
    PYTHONPATH=/tmp/old_checkout python scripts/fuzz_report.py      # another checkout's code, the same table
    python scripts/fuzz_report.py --classes --write-docs            # every generated class -> docs/safety.md

``--classes`` runs every case of tests/e2e/test_fuzz_classes.py (CLI, each in a fresh copy of the workspace and its
own process; a killed writer is run again and must then succeed) and of tests/e2e/test_safety_api.py (the Python
API, in this process), classified as clean / unclear / traceback / hang / silent / data lost
(tests/e2e/test_fuzz_harness.py::classify), one table row per class.

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
    ap.add_argument("--classes", action="store_true", help="run issue 20's generated classes instead of the table")
    ap.add_argument("--seed", type=int, default=20, help="--classes: the generators' seed")
    ap.add_argument("--per-class", type=int, default=0, help="--classes: a sample of N cases per class (0: all)")
    ap.add_argument("--write-docs", action="store_true", help="--classes: put the table into docs/safety.md")
    a = ap.parse_args()
    if a.classes:
        return run_classes(a)
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


DOC_START, DOC_END = "<!-- fuzz-classes:start -->", "<!-- fuzz-classes:end -->"


def run_classes(a) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    from e2e import fuzz_cases as fz
    from e2e import test_fuzz_classes as fc
    from e2e import test_fuzz_harness as fh

    cases = [c for c in fc.sample(a.per_class, a.seed) if a.only in c.id]
    with tempfile.TemporaryDirectory(prefix="fuzz-classes-") as tmp:
        workspace = fh.extend_workspace(fz.make_workspace(Path(tmp) / "workspace"))

        def one(case):
            work = Path(tmp) / f"case-{cases.index(case)}"
            shutil.copytree(workspace, work, symlinks=True)
            res = fh.run_subprocess(case, work, a.timeout)
            if case.expect == "kill":  # killed at byte N: nothing lost, and the next run must succeed
                res["outcome"] = "data lost" if res["changed"] else "clean" if res["exit"] in (-9, 0) else "traceback"
                if res["outcome"] == "clean":
                    again = fh.run_subprocess(fh.Case(case.cls, case.id, case.argv, expect="ok"), work, a.timeout)
                    res["outcome"] = "unclear" if again["outcome"] == "clean" and again["debris"] else again["outcome"]
                    res["last_line"] = again["last_line"]
            shutil.rmtree(work, ignore_errors=True)
            return res

        with ThreadPoolExecutor(a.jobs) as pool:
            results = list(pool.map(one, cases))
        results += run_api(a, Path(tmp))
    table = class_table(results, fh.OUTCOMES)
    for r in results:
        if r["outcome"] != "clean":
            print(f"{r['outcome']:9s} {r['class']}:{r['id'][:90]}: exit {r['exit']}: {r['last_line'][:200]}")
    print(table)
    if a.write_docs:
        doc = ROOT / "docs" / "safety.md"
        text = doc.read_text()
        head, _, rest = text.partition(DOC_START)
        _, _, tail = rest.partition(DOC_END)
        cmd = "python scripts/fuzz_report.py --classes --write-docs" + (f" --per-class {a.per_class}" if a.per_class
                                                                         else "") + f" --seed {a.seed}"  # fmt: skip
        block = f"{DOC_START}\n`{cmd}` (timeout {a.timeout:g} s per case):\n\n{table}\n{DOC_END}"
        doc.write_text(head + block + tail if rest else text.rstrip() + "\n\n" + block + "\n")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1) + "\n")


def run_api(a, tmp: Path) -> list[dict]:
    """The Python API classes, in this process (one tiny target), each under a watchdog."""
    from e2e import test_fuzz_harness as fh
    from e2e import test_safety_api as fa

    from dspark_lightning import load_target

    target, out = load_target("tiny-debug"), []
    for i, (cls, cid, spec) in enumerate(c for c in fa.api_cases(a.seed) if a.only in c[1]):
        work = tmp / f"api-{i}"
        work.mkdir()
        try:
            with fh.watchdog(a.timeout):
                exc = fa.run_api_case(spec, target, work)
            outcome = fa.api_outcome(exc)
        except fh.Hang:
            exc, outcome = None, "hang"
        line = f"{type(exc).__name__}: {exc}" if exc is not None else ""
        out.append({"id": cid, "class": cls, "outcome": outcome, "exit": None, "changed": [], "last_line": line[:300]})
    return out


def class_table(results: list[dict], outcomes: tuple[str, ...]) -> str:
    rows = ["| class | cases | " + " | ".join(outcomes) + " |", "|---" * (len(outcomes) + 2) + "|"]
    classes = list(dict.fromkeys(r["class"] for r in results))
    for cls in [*classes, "all"]:
        rs = [r for r in results if cls in ("all", r["class"])]
        counts = Counter(r["outcome"] for r in rs)
        name = "**all**" if cls == "all" else cls
        rows.append(f"| {name} | {len(rs)} | " + " | ".join(str(counts[o]) for o in outcomes) + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
