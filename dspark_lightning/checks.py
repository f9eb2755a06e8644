"""The validators of user input every floor uses: numbers in range, paths, files, block sizes, token ids, positions.
Each argument is checked by the boundary that receives it (``decode()``, a command, the recipe checks in
``lightning/recipe_checks.py``, a scheduler's constructor) with these.

A bad argument must be refused before any work starts (a model loaded, a prompt decoded, a file written), with a
message naming the argument and its allowed range. :class:`UsageError` (a ``ValueError``) and its subclasses are the
one kind of error the console script prints as one ``dspark-lightning <cmd>: error: ...`` line with exit code 2; any
other exception is a bug and shows its traceback (``DSPARK_TRACEBACK=1`` adds the traceback to a usage error too).
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Any

MAX_BLOCK_SIZE = 128  # a block is drafted in one forward and verified in one: memory grows with it, τ saturates


class UsageError(ValueError):
    """An argument out of range, a path of the wrong kind, or an input file we cannot read: what the user can fix.
    The project's user-facing errors subclass it (``DrafterLoadError``, ``RegistryError``, ``CacheError``, ...)."""


class UnsupportedError(UsageError, NotImplementedError):
    """A valid request this build cannot serve (a target the lean verifier cannot run...): the user picks another
    option. Still a ``NotImplementedError`` for the callers that catch one."""


def at_least(name: str, value: Any, low: int) -> None:
    """``value`` is None or an integer >= ``low`` (``--batch_size``, ``--max_new_tokens``, ...)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise UsageError(f"{name} must be an integer >= {low}, got {value!r}")


def in_range(name: str, value: Any, low: float | None = None, high: float | None = None, *, open_low: bool = False):
    """``value`` is None or a finite number in [low, high] (``(low, high]`` with ``open_low``)."""
    if value is None:
        return
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (low is None or value > low or (value == low and not open_low)) and (high is None or value <= high)
    if not ok:
        lo = "-inf" if low is None else f"{low:g}"
        hi = "inf" if high is None else f"{high:g}"
        raise UsageError(f"{name} must be a finite number in {'(' if open_low else '['}{lo}, {hi}], got {value!r}")


def probability(name: str, value: Any) -> None:
    in_range(name, value, 0.0, 1.0)


def _stat(p: str | os.PathLike) -> os.stat_result | None:
    """``os.stat`` that answers None for any failure (a name too long, a missing parent, no permission)."""
    try:
        return os.stat(p)
    except (OSError, ValueError):
        return None


def file_kind(mode: int) -> str:
    kinds = ((stat.S_ISREG, "a file"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
             (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))  # fmt: skip
    return next((what for test, what in kinds if test(mode)), "not a regular file")


def short(text: Any, n: int = 60) -> str:
    """``ascii()`` of ``text`` cut to about ``n`` characters: safe to print in one line (no newline, no surrogate)."""
    s = ascii(str(text))
    return s if len(s) <= n else f"{s[: n - 12]}...{s[-8:]} ({len(str(text))} characters)"


def _existing_parent(p: Path) -> Path:
    q = Path(os.path.abspath(p))
    while _stat(q) is None and q != q.parent:
        q = q.parent
    return q


def _pathconf(p: Path, key: str, default: int) -> int:
    try:
        return int(os.pathconf(p, key))
    except (OSError, ValueError):
        return default


def path_length(name: str, path: str | os.PathLike) -> Path:
    """Every component of ``path`` within the file system's NAME_MAX and the whole within PATH_MAX (checked before
    anything stats the path: an over-long name makes ``os.stat`` itself fail)."""
    p = Path(path)
    if "\x00" in str(p):
        raise UsageError(f"{name} {short(p)} holds a NUL character, which no file name may contain")
    base = _existing_parent(p)
    name_max, path_max = _pathconf(base, "PC_NAME_MAX", 255), _pathconf(base, "PC_PATH_MAX", 4096)
    for part in p.parts:
        n = len(os.fsencode(part))
        if n > name_max:
            which = "" if len(p.parts) == 1 else f" {short(part, 40)}"
            raise UsageError(f"{name} {short(p)}: the file name{which} is {n} bytes long; the file system allows at "
                             f"most {name_max}")  # fmt: skip
    total = len(os.fsencode(os.path.abspath(p)))
    if total >= path_max:
        raise UsageError(f"{name} {short(p)}: the path is {total} bytes long; the file system allows at most "
                         f"{path_max - 1}")  # fmt: skip
    return p


def input_file(name: str, path: str | os.PathLike) -> Path:
    """An existing, readable regular file (named in the error otherwise). A FIFO or a device is refused before it
    is opened: opening a FIFO blocks until someone writes to it."""
    p = path_length(name, path)
    st = _stat(p)
    if st is None:
        raise UsageError(f"{name} {p} does not exist" if not os.path.lexists(p) else f"{name} {p} cannot be read")
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{name} {p} is not a file: it is {file_kind(st.st_mode)} (a regular file is needed)")
    if not os.access(p, os.R_OK):
        raise UsageError(f"{name} {p} is not readable (permission denied)")
    return p


def regular_entries(name: str, folder: str | os.PathLike) -> None:
    """A model or drafter folder holds only files and folders: a FIFO or a device in it would block its loader."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return  # the loader names what is wrong with the folder itself
    for e in entries:
        st = _stat(e.path)
        if st is not None and not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            raise UsageError(f"{name} {folder}: {e.name} is {file_kind(st.st_mode)}, not a regular file")


def read_json(path: str | os.PathLike, what: str) -> Any:
    """Parse a JSON file; an unreadable, truncated or too deeply nested file is a one-line error naming it."""
    p = input_file(what, path)
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except RecursionError:
        raise UsageError(f"{what} {p} nests too deeply to be a JSON file we read") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"{what} {p} is not readable JSON ({type(exc).__name__}: {exc})") from exc


def output_file(name: str, path: str | os.PathLike | None) -> None:
    """A file we will write at the end: not a directory, a FIFO or a device (the write replaces the entry), in an
    existing writable directory (checked up front, so a bad path does not throw away the work done before it)."""
    if path is None:
        return
    p = path_length(name, path)
    st = _stat(p)
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{name} {p} is a directory; give a file path")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{name} {p} is {file_kind(st.st_mode)}; give a regular file path (it is replaced whole)")
    parent = p.parent if str(p.parent) else Path(".")
    pst = _stat(parent)
    if pst is None or not stat.S_ISDIR(pst.st_mode):
        raise UsageError(f"{name} {p}: the directory {parent} does not exist")
    _writable(name, p, parent)


def _writable(name: str, p: Path, folder: Path) -> None:
    if not os.access(folder, os.W_OK | os.X_OK):
        why = "is on a read-only file system" if _read_only_fs(folder) else "is not writable"
        raise UsageError(f"{name} {p}: the directory {folder} {why}")


def _read_only_fs(folder: Path) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False


def output_dir(name: str, path: str | os.PathLike | None) -> None:
    """A directory we will create (with its parents) or write into: nothing on the way is a file, and the nearest
    existing folder is writable."""
    if path is None or "://" in str(path):  # a URL: its file system answers for itself
        return
    p = path_length(name, path)
    st = _stat(p)
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{name} {p} exists and is not a directory (it is {file_kind(st.st_mode)})")
    q = p
    while _stat(q) is None and q != q.parent and str(q.parent) != str(q):
        q = q.parent
    qst = _stat(q)
    if qst is not None and not stat.S_ISDIR(qst.st_mode):
        raise UsageError(f"{name} {p}: {q} is a file, not a directory")
    _writable(name, p, q if qst is not None else Path("."))


def block_size(name: str, value: Any) -> None:
    """1 <= block_size <= :data:`MAX_BLOCK_SIZE`; a larger block only costs memory (the features and masks grow
    with it, a 100000-token block needs hundreds of GB) while acceptance saturates long before."""
    at_least(name, value, 1)
    if value is not None and value > MAX_BLOCK_SIZE:
        raise UsageError(
            f"{name}={value} is above the supported maximum {MAX_BLOCK_SIZE}: memory grows with the block while "
            "accepted lengths saturate far below it (typical blocks are 4-16)"
        )


def token_id(name: str, value: Any, vocab_size: int) -> None:
    """``value`` is None or an id in ``[0, vocab_size)``."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab_size:
        raise UsageError(f"{name}={value!r} is outside the vocabulary [0, {vocab_size})")


def drafter_config(path: str | os.PathLike) -> dict[str, Any]:
    """Read and check an exported drafter directory's config.json before anything is built from it.

    Names the file and the key at fault: a missing or truncated file, a missing key, a block size out of range, a
    mask token outside the vocabulary. Serving layouts (``Qwen3DSparkModel``, see :mod:`.export`) are checked by
    their own loader.
    """
    p = Path(path)
    if not p.is_dir():
        raise UsageError(f"drafter {p} {'is not a directory' if p.exists() else 'does not exist'}")
    regular_entries("drafter", p)
    cfg = read_json(p / "config.json", "drafter config")
    if not isinstance(cfg, dict):
        raise UsageError(f"drafter config {p / 'config.json'} is not a JSON object")
    if "format_version" not in cfg and "architectures" in cfg:  # a serving layout: its registered reader checks it
        return cfg
    parts = ("drafter",) if "drafter" in cfg else ("backbone", "seq_head", "conf_head", "mask_token_id")
    missing = [
        k for k in ("format_version", "target", "geometry", "block_size", "weights_sha256", *parts) if k not in cfg
    ]
    if missing:
        raise UsageError(f"drafter config {p / 'config.json'} lacks {', '.join(missing)} (not a complete export)")
    geometry = cfg["geometry"]
    if not isinstance(geometry, dict) or not isinstance(geometry.get("vocab_size"), int):
        raise UsageError(f"drafter config {p / 'config.json'}: geometry has no integer vocab_size")
    block_size(f"drafter config {p / 'config.json'}: block_size", cfg["block_size"])
    # the mask token is an input (embedded by the target's embedding): any token of the target's vocabulary, whatever
    # the drafter's output vocabulary
    token_id(f"drafter config {p / 'config.json'}: mask_token_id", cfg.get("mask_token_id"), geometry["vocab_size"])
    input_file("drafter weights", p / "model.safetensors")
    return cfg


def positions_of(target: Any) -> int | None:
    """The target's position limit (``max_position_embeddings``), None when it has none."""
    limit = getattr(getattr(getattr(target, "model", None), "config", None), "max_position_embeddings", None)
    return limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None


def fits_positions(target: Any, needed: int, what: str) -> None:
    """Refuse work that needs more positions than the target has, before anything of that size is allocated."""
    limit = positions_of(target)
    if limit is not None and needed > limit:
        raise UsageError(f"{what} needs {needed} positions; the target {target.name!r} supports {limit}")


def data_positions(target: Any, data: Any) -> None:
    """A ``data:`` section's ``max_length`` within the target's positions and its ``regen.max_new_tokens`` leaving
    room for a prompt: regeneration and training forwards never run past what the target was trained on."""
    limit = positions_of(target)
    if limit is None:
        return
    max_length, new = section_get(data, "max_length"), section_get(section_get(data, "regen"), "max_new_tokens")
    if isinstance(max_length, int) and max_length > limit:
        raise UsageError(f"data.max_length={max_length} is above the {limit} positions of the target "
                         f"{target.name!r}; use at most {limit}")  # fmt: skip
    if isinstance(new, int) and new >= limit:
        raise UsageError(f"data.regen.max_new_tokens={new} leaves no room for a prompt in the {limit} positions of "
                         f"the target {target.name!r}; use less than {limit}")  # fmt: skip


def section_get(section: Any, key: str, default: Any = None) -> Any:
    """``section[key]`` for a dict or a jsonargparse Namespace (recipes arrive as either)."""
    if section is None:
        return default
    if isinstance(section, dict):
        return section.get(key, default)
    return getattr(section, key, default)
