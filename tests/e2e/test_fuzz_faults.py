"""The faults the class-generated fuzz suite injects (tests/e2e/test_fuzz_harness.py runs the cases): a disk that
fills after N bytes, a SIGKILL after N bytes, a read-only folder (for root too), Ctrl-C at the k-th call of a
function, a folder lock held by another writer, a concurrent writer of the same output."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import importlib
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any


class Patch:
    """``setattr`` that ``undo()`` reverts (pytest's MonkeyPatch, without pytest: the subprocess runner uses it)."""

    def __init__(self) -> None:
        self.saved: list[tuple[Any, str, Any]] = []

    def setattr(self, obj: Any, name: str, value: Any) -> None:
        self.saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    def undo(self) -> None:
        for obj, name, value in reversed(self.saved):
            setattr(obj, name, value)
        self.saved.clear()


def _under(root: str, path: Any) -> bool:
    try:
        return os.path.realpath(os.fsdecode(path)).startswith(root)
    except (TypeError, ValueError):
        return False


def _fd_under(root: str, fd: int) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}").startswith(root)
    except OSError:
        return False


def read_only(patch: Patch, folder: Path) -> None:
    """``folder`` behaves as on a read-only mount for this process, root included (chmod does not stop root):
    ``os.access(W_OK)`` says no and every creation, open for writing or rename there fails with EROFS."""
    root = os.path.realpath(folder)
    real_access, real_open, real_mkdir = os.access, os.open, os.mkdir
    real_replace, real_rename, real_unlink = os.replace, os.rename, os.unlink

    def deny(path):
        raise OSError(errno.EROFS, "Read-only file system", os.fsdecode(path))

    def access(path, mode, *a, **k):
        return False if mode & os.W_OK and _under(root, path) else real_access(path, mode, *a, **k)

    def open_(path, flags, *a, **k):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) and _under(root, path):
            deny(path)
        return real_open(path, flags, *a, **k)

    def guard(real):
        def fn(path, *a, **k):
            if _under(root, path) or (a and isinstance(a[0], str | os.PathLike) and _under(root, a[0])):
                deny(path)
            return real(path, *a, **k)

        return fn

    patch.setattr(os, "access", access)
    patch.setattr(os, "open", open_)
    for name, real in (("mkdir", real_mkdir), ("replace", real_replace), ("rename", real_rename),
                       ("unlink", real_unlink)):  # fmt: skip
        patch.setattr(os, name, guard(real))
    import builtins
    import io

    real_builtin_open = builtins.open

    def bopen(file, mode="r", *a, **k):
        if isinstance(file, str | os.PathLike) and any(c in mode for c in "wax+") and _under(root, file):
            deny(file)
        return real_builtin_open(file, mode, *a, **k)

    patch.setattr(builtins, "open", bopen)
    patch.setattr(io, "open", bopen)


def _count_writes(patch: Patch, root: str, budget: int, on_full) -> None:
    """Writes under ``root`` go through until ``budget`` bytes went there, then ``on_full()`` decides; both
    ``os.write`` and files opened with ``open()`` for writing (whose writes never pass through ``os.write``)."""
    import builtins
    import io

    real_write, real_open = os.write, builtins.open
    left = [budget]

    def write(fd, data):
        if not _fd_under(root, fd):
            return real_write(fd, data)
        if left[0] <= 0:
            return on_full()
        n = real_write(fd, memoryview(data).cast("B")[: left[0]])
        left[0] -= n
        return n

    class Budgeted:
        def __init__(self, f):
            self._f = f

        def write(self, data):
            n = len(data.encode() if isinstance(data, str) else data)
            if left[0] < n:
                left[0] = 0
                on_full()
            left[0] -= n
            return self._f.write(data)

        def __getattr__(self, name):
            return getattr(self._f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self._f.__exit__(*exc)

        def __iter__(self):
            return iter(self._f)

    def open_(file, mode="r", *a, **k):
        f = real_open(file, mode, *a, **k)
        if isinstance(file, str | os.PathLike) and any(c in mode for c in "wax+") and _under(root, file):
            return Budgeted(f)
        return f

    patch.setattr(os, "write", write)
    patch.setattr(builtins, "open", open_)
    patch.setattr(io, "open", open_)


def install_fault(patch: Patch, fault: dict | None, work: Path) -> contextlib.AbstractContextManager:
    """Install ``fault`` for a command run in ``work``; returns a context that holds what must outlive the setup
    (a lock, a writer thread) for the duration of the command.

    ``{"kind": "enospc", "root": rel, "room": N}``: writes under ``rel`` fail with ENOSPC after N bytes;
    ``{"kind": "kill", ...}``: the process SIGKILLs itself instead (subprocess runs only);
    ``{"kind": "interrupt", "at": "module:Class.method", "after": k}``: the k+1-th call raises KeyboardInterrupt;
    ``{"kind": "lock", "folder": rel}``: another process's lock on ``rel`` is held;
    ``{"kind": "race", "path": rel}``: a concurrent writer replaces ``rel`` (whole JSON) while the command runs."""
    if not fault:
        return contextlib.nullcontext()
    kind = fault["kind"]
    if kind in ("enospc", "kill"):
        root = os.path.realpath(work / fault["root"])

        def full():
            if kind == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise OSError(errno.ENOSPC, "No space left on device")

        _count_writes(patch, root, int(fault.get("room", 0)), full)
        return contextlib.nullcontext()
    if kind == "interrupt":
        module, _, attr = fault["at"].partition(":")
        owner_name, _, name = attr.rpartition(".")
        owner = importlib.import_module(module)
        for part in filter(None, owner_name.split(".")):
            owner = getattr(owner, part)
        real, calls = getattr(owner, name), [0]

        def interrupted(*a, **k):
            calls[0] += 1
            if calls[0] > int(fault.get("after", 0)):
                raise KeyboardInterrupt
            return real(*a, **k)

        patch.setattr(owner, name, interrupted)
        return contextlib.nullcontext()
    if kind == "lock":
        return held_lock(work / fault["folder"])
    if kind == "race":
        return _racing_writer(work / fault["path"])
    raise ValueError(f"unknown fault {kind!r}")


@contextlib.contextmanager
def held_lock(folder: Path):
    """The folder lock as another writer holds it: its own open file description, so even this process conflicts."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / ".dspark.lock", os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        doc = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(), "command": "fit"}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(doc).encode(), 0)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def _racing_writer(path: Path):
    from dspark_lightning.atomic import atomic_write

    stop = threading.Event()

    def run():
        n = 0
        while not stop.is_set():
            n += 1
            atomic_write(path, json.dumps({"racer": n, "pad": "x" * 4096}) + "\n")
            time.sleep(0.002)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()


def test_the_read_only_harness_refuses_writes_even_for_root(tmp_path):
    from dspark_lightning.atomic import atomic_write

    ro = tmp_path / "ro"
    ro.mkdir()
    patch = Patch()
    read_only(patch, ro)
    try:
        assert not os.access(ro, os.W_OK) and os.access(tmp_path, os.W_OK)
        for write in (lambda: atomic_write(ro / "x.json", "{}"), lambda: (ro / "sub").mkdir(),
                      lambda: open(ro / "y", "w")):  # fmt: skip
            try:
                write()
                raise AssertionError("a write into the read-only folder went through")
            except OSError as exc:
                assert exc.errno == errno.EROFS
    finally:
        patch.undo()
    assert os.listdir(ro) == [] and os.access(ro, os.W_OK)
