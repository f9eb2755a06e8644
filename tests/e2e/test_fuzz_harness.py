"""The harness of the class-generated fuzz suite: a case, the faults it injects and the two ways
to run it, in-process (the test suite) or in a subprocess with a timeout (``scripts/fuzz_report.py``, and the
cases that kill their own process).

A :class:`Case` is an argv for ``dspark-lightning`` run in a scratch workspace (``fuzz_cases.make_workspace`` plus
:func:`extend_workspace`), the files it writes there first (a FIFO, a deep JSON, a recipe with a recursive alias),
the folders that are read-only for it, an injected fault (a full disk after N bytes, a SIGKILL after N bytes, a
Ctrl-C at the k-th call of a function, a folder lock held by another process, a concurrent writer of its output), and
what it must end with. :func:`classify` turns (exit code, stderr, files changed) into the report's classes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

from .fuzz_cases import ANY_ERROR_LINE, argv_for
from .test_fuzz_faults import Patch, held_lock, install_fault, read_only

ROOT = Path(__file__).resolve().parents[2]
FIFO = "<fifo>"  # a value of Case.files: make a named pipe there
INTERRUPT_LINE = re.compile(r"^dspark-lightning( [a-z-]+)?: interrupted \(Ctrl-C\)")
OUTCOMES = ("clean", "unclear", "traceback", "hang", "silent", "data lost")
DEBRIS = re.compile(r"\.(tmp|old|export-tmp)-\d+")


@dataclasses.dataclass
class Case:
    cls: str
    id: str
    argv: list[str]
    files: dict[str, Any] = dataclasses.field(default_factory=dict)  # relative path -> str | bytes | FIFO
    readonly: list[str] = dataclasses.field(default_factory=list)  # folders nothing may be written into
    fault: dict | None = None  # see install_fault
    stdout: str | None = None  # "pipe" (closed by its reader) | "full" (/dev/full)
    expect: str = "error"  # "error": exit 2 + one line | "interrupt": exit 130 + one line | "ok": exit 0

    def to_json(self) -> str:
        files = {k: (v.decode("latin-1") if isinstance(v, bytes) else v) for k, v in self.files.items()}
        binary = [k for k, v in self.files.items() if isinstance(v, bytes)]
        return json.dumps({**dataclasses.asdict(self), "files": files, "binary": binary})

    @staticmethod
    def from_json(text: str) -> Case:
        d = json.loads(text)
        binary = set(d.pop("binary"))
        d["files"] = {k: (v.encode("latin-1") if k in binary else v) for k, v in d["files"].items()}
        return Case(**d)


def extend_workspace(root: Path) -> Path:
    """What the class cases need beyond the workspace of fuzz_cases.py: rollouts for a decoding-free ``calibrate``, a
    drafter copy it may write into, and prior outputs of every writer (their bytes must survive a failed write)."""
    import shutil

    import torch

    from dspark_lightning.calibration import Rollouts

    g = torch.Generator().manual_seed(0)
    n = 480  # 16 prompts x 3 domains (calibrate's defaults), half held out
    Rollouts(torch.randn(n, 2, generator=g).double(), torch.randint(0, 3, (n,), generator=g),
             torch.full((n,), 2), torch.arange(n) % 48, torch.rand(n, 2, generator=g).double() * 4,
             ).save(root / "rollouts.pt")  # fmt: skip
    shutil.copytree(root / "drafter", root / "cal")
    (root / "cal" / "calibration_T1.json").write_text('{"previous": true}\n')
    for rel in ("prev/r.json", "prev/sps.json", "evalout/tau_table.json", "benchout/bench.json",
                "sw/threshold_sweep.json", "sb/serve_bench.json", "exp/config.json"):  # fmt: skip
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text('{"previous": true}\n')
    return root


# --- running a case ----------------------------------------------------------------------------------------------
def write_files(case: Case, work: Path) -> None:
    for rel, content in case.files.items():
        p = work / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if content == FIFO:
            os.mkfifo(p)
        else:
            (p.write_bytes if isinstance(content, bytes) else p.write_text)(content)


def remove_files(case: Case, work: Path) -> None:
    for rel in case.files:
        with contextlib.suppress(OSError):
            (work / rel).unlink()


class Hang(BaseException):
    """The in-process watchdog's alarm (a BaseException: nothing in the command may swallow it)."""


@contextlib.contextmanager
def watchdog(seconds: float):
    def ring(*_):
        raise Hang

    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def fresh_copy(workspace: Path, scratch: Path) -> Path:
    """A copy of the workspace for one case (cases never see each other's outputs)."""
    import shutil

    shutil.copytree(workspace, scratch, symlinks=True)
    return scratch


def run_in_process(case: Case, work: Path, capsys, timeout: float = 120.0) -> dict:
    """Run ``case`` in this process in ``work`` (pytest's ``capsys`` captures its output); returns
    :func:`result`'s dict."""
    from dspark_lightning.cli import main

    assert not (case.fault and case.fault["kind"] == "kill"), "a kill case runs in a subprocess (run_subprocess)"
    write_files(case, work)
    before = contents(work)
    patch, code, err = Patch(), None, ""
    for rel in case.readonly:
        (work / rel).mkdir(parents=True, exist_ok=True)
        read_only(patch, work / rel)
    sigint = signal.getsignal(signal.SIGINT)
    old_stdout, sink = sys.stdout, None
    try:
        if case.stdout:
            sink = _stdout_sink(case.stdout)
            sys.stdout = sink
        with install_fault(patch, case.fault, work), watchdog(timeout), _cwd(work):
            try:
                main(argv_for(case.argv))
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
    except Hang:
        code = None
    finally:
        patch.undo()
        sys.stdout = old_stdout
        signal.signal(signal.SIGINT, sigint)  # Lightning ignores SIGINT after catching a KeyboardInterrupt
        if sink is not None:
            with contextlib.suppress(OSError):
                sink.close()
        err = capsys.readouterr().err
    res = result(case, code, err, lost(case, work, before), debris(work))
    remove_files(case, work)
    return res


def _stdout_sink(kind: str):
    if kind == "full":
        return open("/dev/full", "w")  # noqa: SIM115 - closed by the runner
    r, w = os.pipe()
    os.close(r)  # the reader is gone: every write is EPIPE
    return os.fdopen(w, "w")


@contextlib.contextmanager
def _cwd(path: Path):
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def debris(work: Path) -> list[str]:
    """Temp files or folders of an atomic write left behind (a writer that was killed leaves them; the next run
    removes them)."""
    return [str(p.relative_to(work)) for p in work.rglob("*") if DEBRIS.search(p.name)]


RUNNER = """
import sys
sys.path.insert(0, {tests!r})
from e2e.test_fuzz_harness import child_main
child_main()
"""


def child_main() -> None:
    """The subprocess side of :func:`run_subprocess`: the case as JSON on stdin, its faults installed here."""
    from dspark_lightning.cli import main

    case = Case.from_json(sys.stdin.read())
    patch, work = Patch(), Path.cwd()
    for rel in case.readonly:
        read_only(patch, work / rel)
    with install_fault(patch, case.fault if case.fault and case.fault["kind"] != "lock" else None, work):
        main(argv_for(case.argv))


def run_subprocess(case: Case, work: Path, timeout: float = 120.0) -> dict:
    """Run ``case`` in a fresh interpreter in ``work`` (a real SIGKILL, a real closed pipe or /dev/full)."""
    import subprocess

    write_files(case, work)
    for rel in case.readonly:
        (work / rel).mkdir(parents=True, exist_ok=True)
    before = contents(work)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    cmd = [sys.executable, "-c", RUNNER.format(tests=str(ROOT / "tests"))]
    out = open("/dev/full", "w") if case.stdout == "full" else None  # noqa: SIM115
    lock = held_lock(work / case.fault["folder"]) if case.fault and case.fault["kind"] == "lock" else None
    with lock or contextlib.nullcontext():
        proc = subprocess.Popen(cmd, cwd=work, env=env, stdin=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdout=out or subprocess.PIPE, text=True)  # fmt: skip
        if case.stdout == "pipe":
            proc.stdout.close()  # the reader is gone before the first write
        try:
            _, err = proc.communicate(case.to_json(), timeout=timeout)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            code = None
        finally:
            if out is not None:
                out.close()
    res = result(case, code, err or "", lost(case, work, before), debris(work))
    remove_files(case, work)
    return res


def contents(root: Path) -> dict[str, bytes]:
    """Every regular file below ``root`` (relative path -> bytes); FIFOs are never opened."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def lost(case: Case, work: Path, before: dict[str, bytes]) -> list[str]:
    """Files that existed before the case and vanished or changed other than by an append (a resumable JSONL
    grows; its torn last line is dropped on resume). A lock file's holder record does not count. A command that
    is to succeed (``expect="ok"``) may replace its outputs, but each must be whole: a raced JSON parses."""
    after = contents(work)
    out = [f for f, old in before.items() if not f.endswith(".dspark.lock")
           and (f not in after or not after[f].startswith(old))]  # fmt: skip
    if case.expect == "ok":
        out = []
    if case.fault and case.fault["kind"] == "race":
        try:
            json.loads((work / case.fault["path"]).read_text())
        except (OSError, ValueError):
            out.append(case.fault["path"])
    return out


def result(case: Case, code: int | None, err: str, lost: list[str], left: list[str]) -> dict:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    return {"id": case.id, "class": case.cls, "outcome": classify(case, code, err, lost), "exit": code,
            "changed": lost, "debris": left, "last_line": lines[-1][:300] if lines else ""}  # fmt: skip


def classify(case: Case, code: int | None, err: str, lost: list[str]) -> str:
    """``hang`` (no exit within the timeout) > ``traceback`` (a Python traceback, or an exit code that is none of
    0, 2, 130) > ``data lost`` (a file that existed before changed or vanished) > ``silent`` (exit 0 where an error
    was due) > ``unclear`` (the right exit code, but not one ``dspark-lightning [cmd]: ...`` line last) > ``clean``."""
    if code is None:
        return "hang"
    if "Traceback (most recent call last)" in err or code not in (0, 2, 130) and case.expect != "kill":
        return "traceback"
    if lost:
        return "data lost"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    if case.expect == "ok":
        return "clean" if code == 0 else "unclear"
    if code == 0:
        return "silent"
    if case.expect == "interrupt":
        return "clean" if code == 130 and INTERRUPT_LINE.match(last) else "unclear"
    return "clean" if code == 2 and ANY_ERROR_LINE.match(last) and "Traceback" not in err else "unclear"


def test_classify_orders_the_outcomes():
    c = Case("x", "x", [])
    assert classify(c, None, "", []) == "hang"
    assert classify(c, 1, "Traceback (most recent call last):\n  boom", []) == "traceback"
    assert classify(c, 2, "dspark-lightning decode: error: bad", ["a.json"]) == "data lost"
    assert classify(c, 0, "", []) == "silent"
    assert classify(c, 2, "usage: ...\nsomething", []) == "unclear"
    assert classify(c, 2, "dspark-lightning decode: error: --x must be ...", []) == "clean"
    i = dataclasses.replace(c, expect="interrupt")
    assert classify(i, 130, "dspark-lightning fit: interrupted (Ctrl-C); ...", []) == "clean"
    assert classify(i, 2, "dspark-lightning fit: error: x", []) == "unclear"


def test_a_case_survives_its_json_round_trip():
    c = Case("paths", "p", ["decode", "--prompt", "\udcff"], files={"a": b"\xff\x00", "b": FIFO, "c": "t"},
             fault={"kind": "enospc", "root": ".", "room": 3}, expect="error")  # fmt: skip
    assert Case.from_json(c.to_json()) == c
