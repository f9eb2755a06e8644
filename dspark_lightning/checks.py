"""Up-front checks of user input, shared by the commands, ``decode()`` and the recipe loader.

A bad argument must be refused before any work starts (a model loaded, a prompt decoded, a file written), with a
message naming the argument and its allowed range; :class:`UsageError` is a ``ValueError``, so the console script
prints it as one ``dspark-lightning <cmd>: error: ...`` line and exits with code 2.
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
    """An argument out of range, a path of the wrong kind, or an input file we cannot read."""


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


def temperature(name: str, value: Any) -> None:
    in_range(name, value, 0.0)


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
        raise UsageError(f"{what} {p} is not readable JSON ({type(exc).__name__}: {exc})") from None


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
    if "format_version" not in cfg and "architectures" in cfg:  # a serving layout: export/serving.py checks it
        return cfg
    parts = ("drafter", "drafter_args") if "drafter" in cfg else ("backbone", "seq_head", "conf_head", "mask_token_id")
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
    max_length, new = _get(data, "max_length"), _get(_get(data, "regen"), "max_new_tokens")
    if isinstance(max_length, int) and max_length > limit:
        raise UsageError(f"data.max_length={max_length} is above the {limit} positions of the target "
                         f"{target.name!r}; use at most {limit}")  # fmt: skip
    if isinstance(new, int) and new >= limit:
        raise UsageError(f"data.regen.max_new_tokens={new} leaves no room for a prompt in the {limit} positions of "
                         f"the target {target.name!r}; use less than {limit}")  # fmt: skip


def _get(section: Any, key: str, default: Any = None) -> Any:
    """``section[key]`` for a dict or a jsonargparse Namespace (recipes arrive as either)."""
    if section is None:
        return default
    if isinstance(section, dict):
        return section.get(key, default)
    return getattr(section, key, default)


def data_args(data: Any, datamodule: Any = None) -> None:
    """A recipe's ``data:`` section (``fit``, ``prepare``): sizes and fractions in range before the target answers a
    single prompt (a negative batch size would otherwise fail only after regeneration, or loop). ``datamodule``: the
    class the section builds (``DSparkDataModule``: passed in by the Lightning commands, as this leaf imports no layer
    above it), whose non-optional arguments must not be null."""
    if datamodule is not None:
        not_null("data", data, datamodule)
    for key, low in (("batch_size", 1), ("max_length", 2), ("max_anchors", 1), ("min_supervised", 0),
                     ("num_workers", 0), ("shuffle_buffer", 1)):  # fmt: skip
        at_least(f"data.{key}", _get(data, key), low)
    probability("data.heldout_fraction", _get(data, "heldout_fraction"))
    regen = _get(data, "regen")
    for key in ("batch_size", "max_new_tokens", "concurrency", "max_turns"):
        at_least(f"data.regen.{key}", _get(regen, key), 1)
    temperature("data.regen.temperature", _get(regen, "temperature"))
    in_range("data.regen.top_p", _get(regen, "top_p"), 0.0, 1.0, open_low=True)
    at_least("data.regen.top_k", _get(regen, "top_k"), 1)
    regen_dtype = _get(regen, "dtype")
    if regen_dtype not in (None, "fastest"):
        from .devices import DTYPES

        if str(regen_dtype).lower().removeprefix("torch.") not in DTYPES:
            raise UsageError(f"data.regen.dtype must be null, fastest or one of {', '.join(sorted(set(DTYPES)))}; "
                             f"got {short(regen_dtype)}")  # fmt: skip
    work, target = _get(data, "work_dir"), _get(data, "target")
    if isinstance(work, str) and "://" not in work:
        path_length("data.work_dir", work)
    if isinstance(target, str) and os.path.isdir(target):
        regular_entries("data.target", target)


def model_args(model: Any) -> None:
    """A recipe's ``model:`` section, the parts cheap to check before the target loads: the block size (a huge one
    allocates hundreds of GB at construction) and the mask token's sign (its upper bound needs the vocabulary)."""
    block_size("model.block_size", _get(model, "block_size"))
    mask = _get(model, "mask_token_id")
    if mask is not None:
        at_least("model.mask_token_id", mask, 0)


def rank_args(rank: int | None, world_size: int | None) -> None:
    """``--rank`` / ``--world_size`` of a sharded command: 0 <= rank < world_size."""
    at_least("--rank", rank, 0)
    at_least("--world_size", world_size, 1)
    if rank is not None and world_size is not None and rank >= world_size:
        raise UsageError(f"--rank {rank} is not below --world_size {world_size}")


def _int_or_fraction(name: str, value: Any, low: int, fraction_low_open: bool) -> None:
    """An integer >= ``low`` (a count) or a float in [0, 1] / (0, 1] (a fraction), as Lightning reads them."""
    if value is None:
        return
    if isinstance(value, float) and not isinstance(value, bool):
        in_range(name, value, 0.0, 1.0, open_low=fraction_low_open)
    elif isinstance(value, bool) or not isinstance(value, int) or value < low:
        what = "(0, 1]" if fraction_low_open else "[0, 1]"
        raise UsageError(f"{name} must be an integer >= {low} or a fraction in {what}, got {value!r}")


def trainer_args(trainer: Any) -> None:
    """A recipe's ``trainer:`` options that Lightning divides by or loops on, in range before anything is built
    (``val_check_interval: 0`` or ``accumulate_grad_batches: 0`` would otherwise fail deep in the loop, and
    ``max_steps: 0`` train nothing and export an untrained drafter)."""
    if trainer is None:
        return
    for key, low in (("accumulate_grad_batches", 1), ("log_every_n_steps", 1), ("check_val_every_n_epoch", 1),
                     ("num_nodes", 1), ("min_steps", 0), ("min_epochs", 0), ("num_sanity_val_steps", -1),
                     ("reload_dataloaders_every_n_epochs", 0)):  # fmt: skip
        at_least(f"trainer.{key}", _get(trainer, key), low)
    for key in ("max_steps", "max_epochs"):
        v = _get(trainer, key)
        if v is not None and v != -1 and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise UsageError(f"trainer.{key} must be -1 (no limit) or an integer >= 1, got {v!r}")
    _int_or_fraction("trainer.val_check_interval", _get(trainer, "val_check_interval"), 1, True)
    for key in ("limit_train_batches", "limit_val_batches", "limit_test_batches", "overfit_batches"):
        _int_or_fraction(f"trainer.{key}", _get(trainer, key), 0, False)
    in_range("trainer.gradient_clip_val", _get(trainer, "gradient_clip_val"), 0.0)
    devices = _get(trainer, "devices")
    if isinstance(devices, str) and devices.strip().lstrip("-").isdigit():
        devices = int(devices)
    bad = (isinstance(devices, bool) or (isinstance(devices, int) and devices != -1 and devices < 1)
           or (isinstance(devices, list | tuple) and (not devices or any(
               isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in devices))))  # fmt: skip
    if bad:
        raise UsageError(f"trainer.devices must be 'auto', -1 (all), a count >= 1 or a non-empty list of device "
                         f"indices, got {devices!r}")  # fmt: skip


_MISSING = object()


def _admits_none(hint: Any) -> bool:
    import types
    import typing

    if hint is None or hint is Any or hint is type(None):
        return True
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        return any(_admits_none(a) for a in typing.get_args(hint))
    return False


def _dataclass_of(hint: Any) -> Any:
    import dataclasses
    import typing

    for h in (hint, *typing.get_args(hint)):
        if dataclasses.is_dataclass(h):
            return h
    return None


def not_null(prefix: str, section: Any, cls: Any) -> None:
    """Keys of ``cls`` (its ``__init__`` or dataclass fields) typed without ``None`` must not be given ``null``
    (``model.block_size: null`` would otherwise reach the drafter as None); nested dataclasses (``data.regen``) and
    ``class_path`` components (``model.backbone.init_args``) are followed."""
    import importlib
    import inspect
    import typing

    if section is None or cls is None:
        return
    try:
        hints = typing.get_type_hints(cls.__init__ if not hasattr(cls, "__dataclass_fields__") else cls)
        params = [p for p in inspect.signature(cls).parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD
                  or p.kind is p.KEYWORD_ONLY]  # fmt: skip
    except Exception:  # noqa: BLE001 - hints that do not resolve: jsonargparse checks the types itself
        return
    for p in params:
        value, hint = _get(section, p.name, _MISSING), hints.get(p.name)
        if value is None and hint is not None and not _admits_none(hint):
            raise UsageError(f"{prefix}.{p.name} must not be null: it is {_type_name(hint)}")
        if value is _MISSING or value is None:
            continue
        sub = _dataclass_of(hint)
        if sub is not None:
            not_null(f"{prefix}.{p.name}", value, sub)
        elif isinstance(_get(value, "class_path"), str):
            module, _, name = _get(value, "class_path").rpartition(".")
            try:
                component = getattr(importlib.import_module(module), name)
            except (ImportError, AttributeError, ValueError):
                continue  # jsonargparse names an unknown class itself
            not_null(f"{prefix}.{p.name}.init_args", _get(value, "init_args"), component)


def _type_name(hint: Any) -> str:
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(hint, f"{hint}")


def lightning_args(cfg: Any, classes: dict[str, Any]) -> None:
    """What ``fit`` / ``validate`` / ``test`` check before anything is built, beyond :func:`model_args` and
    :func:`data_args`: the trainer's counts, no ``null`` for a required value, the folders it writes."""
    trainer_args(_get(cfg, "trainer"))
    for prefix, cls in classes.items():
        not_null(prefix, _get(cfg, prefix), cls)
    output_dir("trainer.default_root_dir", _get(_get(cfg, "trainer"), "default_root_dir"))
    output_dir("data.work_dir", _get(_get(cfg, "data"), "work_dir"))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def decode_inputs(prompts: Any, max_new_tokens: Any, temperature: Any, seed: Any, seeds: Any,
                  dtypes: tuple = ()) -> None:  # fmt: skip
    """What ``decode()`` takes beyond :func:`~.infer.decode.check_decode_args`, checked before anything is built:
    the required numbers are not None, seeds are ints, the prompts are a string, a tensor or a list (never bytes, a
    dict or a number, which iterate into something else), dtype names exist. A scheduler spec is checked where it is
    built (:func:`~.infer.schedulers.build_scheduler`)."""
    if max_new_tokens is None or temperature is None:
        raise UsageError(f"{'max_new_tokens' if max_new_tokens is None else 'temperature'} must be given, got None")
    if not _is_int(seed):
        raise UsageError(f"seed must be an int, got {seed!r}")
    if seeds is not None and (not isinstance(seeds, list | tuple) or not all(_is_int(s) for s in seeds)):
        raise UsageError(f"seeds must be ints, in a list with one per prompt, got {short(seeds)}")
    import torch

    if not isinstance(prompts, str | list | tuple | torch.Tensor):
        raise UsageError(f"prompts must be a string, a list of prompts or a tensor of token ids, got "
                         f"{type(prompts).__name__}")  # fmt: skip
    if isinstance(prompts, list | tuple) and prompts and not isinstance(prompts[0], int | dict):
        for i, p in enumerate(prompts):  # a list of prompts: each one a string, turns, token ids or a tensor
            if not isinstance(p, str | list | tuple | torch.Tensor) or isinstance(p, bool):
                raise UsageError(f"prompt {i} must be a string, a list of turns or token ids, got {type(p).__name__}")
    from .devices import resolve_dtype

    for name, value in dtypes:
        if isinstance(value, str):
            try:
                resolve_dtype(value, "cpu")
            except ValueError as exc:
                raise UsageError(f"{name}: {exc}") from None
