"""One writer per folder: an advisory ``flock`` on ``<folder>/.dspark.lock``.

``fit`` (its ``trainer.default_root_dir`` and ``data.work_dir``), ``prepare`` (the work dir) and ``calibrate`` (the
drafter dir) hold it for as long as they run; a second command on the same folder ends at once with a one-line
:class:`FolderLockedError` naming the holder (pid, host, start time, written into the lock file as JSON). The
kernel drops a ``flock`` when its process dies, so the lock of a killed run is simply taken over; the file itself
stays (deleting it would let two processes lock two different files of one name).

Locks are re-entrant within a process (``fit`` locks the work dir, then prepares the data it holds). On a
network file system that does not support ``flock`` the lock is skipped with a warning.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

from .checks import UsageError

LOCK_FILE = ".dspark.lock"

try:
    import fcntl
except ImportError:  # pragma: no cover (Windows)
    fcntl = None

_held: dict[str, list] = {}  # realpath of the folder -> [fd, depth]


class FolderLockedError(UsageError, RuntimeError):
    """Another live process holds the folder's lock (a usage error, still a ``RuntimeError`` for the callers that
    catch one)."""


def holder(folder: str | os.PathLike) -> dict | None:
    """The holder record of ``folder``'s lock file (None when absent or unreadable); says nothing of liveness."""
    try:
        doc = json.loads((Path(folder) / LOCK_FILE).read_text() or "null")
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _describe(doc: dict | None) -> str:
    if not doc:
        return "another process (its details are not written yet)"
    started = doc.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if isinstance(started, int | float) else "?"
    cmd = f"`{doc['command']}` " if doc.get("command") else ""
    return f"{cmd}pid {doc.get('pid')} on host {doc.get('host')}, started {when}"


def acquire(folder: str | os.PathLike, command: str = "") -> Path:
    """Take ``folder``'s lock (creating the folder) or raise :class:`FolderLockedError` naming the holder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    key = os.path.realpath(folder)
    if key in _held:
        _held[key][1] += 1
        return folder
    path = folder / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                    raise FolderLockedError(
                        f"{folder} is in use by {_describe(holder(folder))}; one writer per folder: wait for it to "
                        "finish, or give this run another folder"
                    ) from None
                if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                    raise
                warnings.warn(f"{path}: this file system has no flock ({exc.strerror}); {folder} is not locked",
                              stacklevel=2)  # fmt: skip
        doc = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(), "command": command}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(doc) + "\n").encode(), 0)
        with contextlib.suppress(OSError):
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        raise
    _held[key] = [fd, 1]
    return folder


def release(folder: str | os.PathLike) -> None:
    key = os.path.realpath(folder)
    entry = _held.get(key)
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] > 0:
        return
    del _held[key]
    fd = entry[0]
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)  # no stale holder record once released
    os.close(fd)  # closing the only descriptor drops the flock


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike, command: str = "") -> Iterator[Path]:
    """``with folder_lock(dir, "fit"):`` hold ``dir``'s lock for the block."""
    acquire(folder, command)
    try:
        yield Path(folder)
    finally:
        release(folder)


def is_primary_process() -> bool:
    """Rank 0 of its job (no rank variables at all for a single process): the only process that takes a lock, so
    the ranks Lightning or torchrun start for one run do not refuse each other."""
    for var in ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID"):
        value = os.environ.get(var, "0").strip() or "0"
        if value != "0":
            return False
    return True
