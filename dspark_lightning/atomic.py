"""Writes that are whole or absent, and that survive a full disk.

Every file the project writes goes through :func:`atomic_write` / :func:`atomic_writer` (a temp file in the *same*
directory, written, flushed, fsynced, ``os.replace``-d over the final name, then the directory fsynced), every
folder through :func:`atomic_dir` (built in a sibling temp folder, then swapped in), and resumable JSONL through
:func:`append_durable` (a failed append is cut back to the file's previous size). A reader therefore sees the old
file or the new one, never half of one, and the temp never crosses a file system (a copy that breaks off).

On ENOSPC / EDQUOT the temp is removed and :class:`DiskFullError` is raised: an ``OSError`` with that errno whose
message names the path, the space it needs and the space that is free (the console script prints it in one line).

Temp names carry the writer's pid (``.<name>.tmp-<pid>-<random>``): debris of a killed writer (a pid no longer
alive on this machine) is removed by the next write to the same path; a live writer's is left alone.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
CHUNK = 8 << 20  # bytes per os.write call

_UMASK = os.umask(0)
os.umask(_UMASK)


class DiskFullError(OSError):
    """A write that ran out of space (ENOSPC / EDQUOT); the previous file or folder at ``path`` is untouched."""

    def __init__(self, path: str | os.PathLike, needed: int, free: int, err: int = errno.ENOSPC, what: str = "file"):
        self.path, self.needed, self.free, self.what = Path(path), int(needed), int(free), what
        super().__init__(err, os.strerror(err), str(path))

    def __str__(self) -> str:
        return (
            f"no space left on the device writing {self.path}: it needs at least {human_bytes(self.needed)} free "
            f"there, {human_bytes(self.free)} is free (the previous {self.what}, if any, is untouched); "
            "free some space and run the command again"
        )


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError  # pragma: no cover


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in DISK_FULL


def free_bytes(path: str | os.PathLike) -> int:
    """Free bytes on the file system holding ``path`` (its nearest existing parent)."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return 0


def stdout_failed(err: int | None = None) -> bool:
    """Whether the standard output no longer takes what is printed to it: a pipe whose reader is gone (poll says
    POLLERR), or for ``err`` ENOSPC a device that is not a terminal (``> /dev/full``) or a file on a full file
    system. A failed write there names no file, and Python drops the buffer it could not write, so flushing
    again proves nothing."""
    import select
    import stat

    try:
        sys.stdout.flush()
    except (OSError, ValueError, AttributeError):
        return True
    try:
        fd = sys.stdout.fileno()
        st = os.fstat(fd)
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is both: a captured stdout
        return False
    if stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode):
        poll = select.poll()
        poll.register(fd, select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poll.poll(0))
    if err in DISK_FULL:
        if stat.S_ISCHR(st.st_mode):
            return not os.isatty(fd)
        if stat.S_ISREG(st.st_mode):
            vfs = os.fstatvfs(fd)
            return vfs.f_bavail == 0 or vfs.f_bfree == 0
    return False


def disk_full_message(exc: OSError) -> str:
    """One line for an ENOSPC / EDQUOT raised outside this module (a logger's file, a library's write, stdout)."""
    if isinstance(exc, DiskFullError):
        return str(exc)
    if not exc.filename and stdout_failed(exc.errno):
        return "no space left on the device of the standard output (e.g. `> /dev/full`); free some space or redirect it"
    where = exc.filename or "a file"
    free = human_bytes(free_bytes(exc.filename)) if exc.filename else "?"
    return f"no space left on the device writing {where} ({exc.strerror}; {free} free); free some space and rerun"


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename or a new entry in ``path`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data).cast("B")
    while view:
        n = os.write(fd, view[:CHUNK])
        view = view[n:]


class _Sink:
    """A write-only binary file over a raw descriptor (what ``torch.save`` / ``savefig`` write to); counts bytes."""

    def __init__(self, fd: int) -> None:
        self.fd, self.attempted = fd, 0
        self.error: OSError | None = None  # the first failed write (a library may wrap it in its own error)

    def write(self, data) -> int:
        data = data.encode() if isinstance(data, str) else data
        n = memoryview(data).nbytes
        self.attempted += n
        try:
            _write_all(self.fd, data)
        except OSError as exc:
            self.error = self.error or exc
            raise
        return n

    def flush(self) -> None:
        pass

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.attempted


def _alive_writer(pid: int | None) -> bool:
    if pid is None or pid <= 0:
        return False
    try:
        os.kill(pid, 0)  # our own pid included
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        pass
    return True


def _debris_pid(name: str, marker: str) -> int | None:
    digits = name.split(marker, 1)[1].split("-", 1)[0]
    return int(digits) if digits.isdigit() else None


def remove_debris(parent: Path, prefix: str, what: str = "write") -> list[Path]:
    """Remove ``parent/<prefix>*`` left by writers that are no longer alive (an unparseable pid counts as dead)."""
    removed = []
    for p in parent.glob(glob_escape(prefix) + "*"):
        pid = _debris_pid(p.name, prefix)
        if _alive_writer(pid):
            continue  # a live writer's temp (or ours): ignored, never blocking
        warnings.warn(f"removing {p}, left by an interrupted {what}", stacklevel=3)
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        removed.append(p)
    return removed


def glob_escape(s: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in s)


def _tmp_prefix(path: Path) -> str:
    return f".{path.name}.tmp-"


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike, *, size_hint: int = 0) -> Iterator[_Sink]:
    """Yield a binary file whose bytes replace ``path`` atomically when the block ends without an error.

    ``size_hint``: bytes the whole file will take, if known, for the message of a disk that fills up.
    """
    path = Path(path)
    parent = path.parent
    parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a killed write's temp file: removed quietly
        remove_debris(parent, _tmp_prefix(path))
    fd, tmp = tempfile.mkstemp(prefix=f"{_tmp_prefix(path)}{os.getpid()}-", dir=parent)
    sink = _Sink(fd)
    try:
        os.fchmod(fd, _mode_of(path))
        yield sink
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, path)
        fsync_dir(parent)
    except BaseException as exc:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        cause = sink.error if sink.error is not None else exc  # torch.save turns a failed write into RuntimeError
        if is_disk_full(cause) and not isinstance(cause, DiskFullError):
            needed = max(size_hint, sink.attempted, _size(path))
            raise DiskFullError(path, needed, free_bytes(parent), cause.errno) from exc
        if cause is not exc:
            raise cause from exc
        raise


def _mode_of(path: Path) -> int:
    """Keep an existing file's permissions; a new file gets the usual ``0o666 & ~umask`` (mkstemp makes 0o600)."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        return 0o666 & ~_UMASK


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def atomic_write(path: str | os.PathLike, data: str | bytes) -> Path:
    """Replace ``path`` by ``data`` (str is UTF-8): all or nothing, durable once this returns."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    with atomic_writer(path, size_hint=len(raw)) as f:
        f.write(raw)
    return Path(path)


def append_durable(path: str | os.PathLike, data: str | bytes) -> None:
    """Append ``data`` to ``path`` and fsync; on any error the file is cut back to its size before the call, so it
    never keeps half a record (a disk that fills up raises :class:`DiskFullError`)."""
    path = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    new = not path.exists()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
    try:
        start = os.lseek(fd, 0, os.SEEK_END)
        try:
            _write_all(fd, raw)
            os.fsync(fd)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
                os.fsync(fd)
            if is_disk_full(exc) and not isinstance(exc, DiskFullError):
                raise DiskFullError(path, len(raw), free_bytes(path), exc.errno) from exc
            raise
    finally:
        os.close(fd)
    if new:
        fsync_dir(path.parent)


def _tree_bytes(root: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(root):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, f)).st_size
    return total


def _fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for f in files:
            fd = os.open(os.path.join(dirpath, f), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(dirpath)


def dir_prefixes(final: Path, tag: str = "") -> tuple[str, str]:
    """(temp prefix, old prefix) of :func:`atomic_dir`'s siblings of ``final``."""
    return f".{final.name}.{tag}tmp-", f".{final.name}.{tag}old-"


def recover_dir(final: Path, tag: str = "", what: str = "write") -> None:
    """Clean the siblings a killed :func:`atomic_dir` left: a swap killed between its two renames left the previous
    folder under the old name and none under the final one, so that folder is put back; the rest is removed."""
    tmp_prefix, old_prefix = dir_prefixes(final, tag)
    if not final.exists():
        olds = [p for p in final.parent.glob(glob_escape(old_prefix) + "*") if p.is_dir()]
        dead = [p for p in olds if not _alive_writer(_debris_pid(p.name, old_prefix))]
        if dead:
            newest = max(dead, key=lambda p: p.stat().st_mtime_ns)
            warnings.warn(f"restoring {final} from {newest}, left by an interrupted {what}", stacklevel=3)
            newest.rename(final)
    remove_debris(final.parent, tmp_prefix, what)
    remove_debris(final.parent, old_prefix, what)


@contextlib.contextmanager
def atomic_dir(final: str | os.PathLike, *, tag: str = "", what: str = "write", carry=None) -> Iterator[Path]:
    """Yield an empty temp folder next to ``final``; when the block ends without an error it replaces ``final``.

    The swap renames the previous folder away, the new one in, then deletes the previous one; a failure at any
    point (a full disk, an exception, a kill: see :func:`recover_dir`) leaves the previous folder as it was.
    ``carry(name) -> bool``: top-level entries of the previous folder to copy into the new one when it has no
    entry of that name (files the writer does not own, kept across an overwrite).
    """
    final = Path(final)
    parent = final.parent
    parent.mkdir(parents=True, exist_ok=True)
    recover_dir(final, tag, what)
    tmp_prefix, old_prefix = dir_prefixes(final, tag)
    tmp = Path(tempfile.mkdtemp(prefix=f"{tmp_prefix}{os.getpid()}-", dir=parent))
    try:
        yield tmp
        if carry is not None and final.is_dir():
            for entry in final.iterdir():
                if carry(entry.name) and not (tmp / entry.name).exists():
                    if entry.is_dir():
                        shutil.copytree(entry, tmp / entry.name, symlinks=True)
                    else:
                        shutil.copy2(entry, tmp / entry.name)
        _fsync_tree(tmp)
        _swap_in(tmp, final, old_prefix)
    except BaseException as exc:
        written = _tree_bytes(tmp) + (exc.needed if isinstance(exc, DiskFullError) else 0)
        shutil.rmtree(tmp, ignore_errors=True)
        if is_disk_full(exc):
            raise DiskFullError(final, written, free_bytes(parent), exc.errno, "folder") from exc
        raise


def _swap_in(tmp: Path, final: Path, old_prefix: str) -> None:
    parent = final.parent
    if final.is_dir() and not final.is_symlink() and not any(final.iterdir()):
        final.rmdir()
    if not final.exists():
        os.rename(tmp, final)
        fsync_dir(parent)
        return
    if not final.is_dir():
        raise FileExistsError(f"{final} exists and is not a directory")
    old = parent / f"{old_prefix}{os.getpid()}-{secrets.token_hex(4)}"
    os.rename(final, old)
    try:
        os.rename(tmp, final)
    except BaseException:
        os.rename(old, final)
        raise
    fsync_dir(parent)
    shutil.rmtree(old, ignore_errors=True)
