"""Up-front checks of user input, shared by the commands, ``decode()`` and the recipe loader.

A bad argument must be refused before any work starts (a model loaded, a prompt decoded, a file written), with a
message naming the argument and its allowed range; :class:`UsageError` is a ``ValueError``, so the console script
prints it as one ``dspark-lightning <cmd>: error: ...`` line and exits with code 2.
"""

from __future__ import annotations

import json
import math
import os
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


def input_file(name: str, path: str | os.PathLike) -> Path:
    """An existing regular file (named in the error otherwise)."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"{name} {p} does not exist")
    if not p.is_file():
        raise UsageError(f"{name} {p} is not a file")
    return p


def read_json(path: str | os.PathLike, what: str) -> Any:
    """Parse a JSON file; an unreadable or truncated file is a one-line error naming it."""
    p = Path(path)
    try:
        if not p.is_file():  # a FIFO or a device would block the read forever
            raise UsageError(f"{what} {p} is not a regular file")
        return json.loads(p.read_text())
    except RecursionError:
        raise UsageError(f"{what} {p} nests too deeply to be a JSON file we read") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        if isinstance(exc, UsageError):
            raise
        raise UsageError(f"{what} {p} is not readable JSON ({type(exc).__name__}: {exc})") from None


def output_file(name: str, path: str | os.PathLike | None) -> None:
    """A file we will write at the end: not a directory, in an existing writable directory (checked up front, so
    a bad path does not throw away the work done before the write)."""
    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{name} {p} is a directory; give a file path")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"{name} {p}: the directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"{name} {p}: the directory {parent} is not writable")


def output_dir(name: str, path: str | os.PathLike | None) -> None:
    """A directory we will create (with its parents) or write into: nothing on the way is a file, and the nearest
    existing folder is writable."""
    if path is None:
        return
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UsageError(f"{name} {p} exists and is not a directory")
    q = p
    while not q.exists() and q != q.parent:
        q = q.parent
    if not q.is_dir():
        raise UsageError(f"{name} {p}: {q} is a file, not a directory")
    if not os.access(q, os.W_OK):
        raise UsageError(f"{name} {p}: {q} is not writable")


def block_size(name: str, value: Any) -> None:
    """1 <= block_size <= :data:`MAX_BLOCK_SIZE`; a larger block only costs memory (the features and masks grow
    with it, a 100000-token block needs hundreds of GB) while acceptance saturates long before."""
    at_least(name, value, 1)
    if value > MAX_BLOCK_SIZE:
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
    mask token outside the vocabulary. Serving layouts (``Qwen3DSparkModel``, see :mod:`.interop`) are checked by
    their own loader.
    """
    p = Path(path)
    if not p.is_dir():
        raise UsageError(f"drafter {p} {'is not a directory' if p.exists() else 'does not exist'}")
    cfg = read_json(input_file("drafter config", p / "config.json"), "drafter config")
    if not isinstance(cfg, dict):
        raise UsageError(f"drafter config {p / 'config.json'} is not a JSON object")
    from .interop import is_serving_config

    if is_serving_config(cfg):
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
    vocab = geometry.get("draft_vocab_size") or geometry["vocab_size"]
    token_id(f"drafter config {p / 'config.json'}: mask_token_id", cfg.get("mask_token_id"), vocab)
    input_file("drafter weights", p / "model.safetensors")
    return cfg


def load_drafter_checked(path: str | os.PathLike, target: Any, dtype: Any = None) -> Any:
    """:func:`~dspark_lightning.load_drafter` after :func:`drafter_config`; any failure to build the drafter from
    the files (a truncated weights file, a component argument out of range) becomes one error naming the
    directory, since the files, not the program, are what the user can fix."""
    from .export import DrafterLoadError, load_drafter

    drafter_config(path)
    try:
        return load_drafter(Path(path), target, dtype=dtype)
    except (DrafterLoadError, UsageError):
        raise
    except Exception as exc:  # noqa: BLE001 - any error here comes from the files of one directory
        msg = " ".join(str(exc).split()) or type(exc).__name__
        raise DrafterLoadError(f"drafter {path} cannot be loaded ({type(exc).__name__}: {msg[:300]})") from None


def load_target_checked(name: str, **kwargs: Any) -> Any:
    """:func:`~dspark_lightning.load_target` whose failure (an unknown name, a directory without a model, a
    truncated weights file) is one error naming the target."""
    from . import load_target

    try:
        return load_target(name, **kwargs)
    except UsageError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever HF raises for a bad model directory, the cause is the input
        msg = " ".join(str(exc).split()) or type(exc).__name__
        raise UsageError(f"target {name!r} cannot be loaded ({type(exc).__name__}: {msg[:300]})") from None


def fits_positions(target: Any, needed: int, what: str) -> None:
    """Refuse work that needs more positions than the target has, before anything of that size is allocated."""
    limit = getattr(getattr(getattr(target, "model", None), "config", None), "max_position_embeddings", None)
    if limit is not None and needed > limit:
        raise UsageError(f"{what} needs {needed} positions; the target {target.name!r} supports {limit}")


def _get(section: Any, key: str, default: Any = None) -> Any:
    """``section[key]`` for a dict or a jsonargparse Namespace (recipes arrive as either)."""
    if section is None:
        return default
    if isinstance(section, dict):
        return section.get(key, default)
    return getattr(section, key, default)


def data_args(data: Any) -> None:
    """A recipe's ``data:`` section (``fit``, ``prepare``): sizes and fractions in range before the target answers a
    single prompt (a negative batch size used to fail only after regeneration, or loop)."""
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
