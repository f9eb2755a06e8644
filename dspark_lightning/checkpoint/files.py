"""What every exported layout shares: the load error, the weight and config hashes, reading config.json, the
temp-folder tag of an export in progress, and placing a loaded drafter next to its target."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

from ..checks import UsageError, regular_entries, short
from ..devices import resolve_device, resolve_drafter_dtype

FORMAT_VERSION = 2
HASH_KEYS = ("weights_sha256", "config_sha256")
EXPORT_TAG = "export-"  # temp folders are .<name>.export-tmp-<pid>-*, a swapped-out one .<name>.export-old-<pid>-*
OWN_FILES = ("config.json", "model.safetensors")


class DrafterLoadError(UsageError):
    """An exported drafter that cannot be used with the given target, or whose files cannot be read: names the file
    (and the field) at fault."""


def weights_sha256(state: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for k in sorted(state):
        t = state[k].detach().cpu().contiguous()
        h.update(k.encode())
        h.update(str(t.dtype).encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def config_sha256(cfg: dict[str, Any]) -> str:
    """SHA-256 of everything in config.json but the two hashes: every field that decides how the drafter is rebuilt
    and behaves (block size, mask token, geometry, parts and their arguments, convention, target, layer ids...)."""
    rest = {k: v for k, v in json.loads(json.dumps(cfg)).items() if k not in HASH_KEYS}  # as read back from disk
    return hashlib.sha256(json.dumps(rest, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def read_safetensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors and header metadata of a safetensors file, read from its bytes: a POSIX path need not be UTF-8
    (safetensors' own file functions refuse such names). Raises safetensors' or json's errors on a damaged file."""
    from safetensors.torch import load

    data = Path(path).read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + size]) if 8 < 8 + size <= len(data) else {}
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return load(data), dict(meta) if isinstance(meta, dict) else {}


WEIGHT_LIMIT = 1e6  # no trained drafter weight comes near; beyond it activations overflow to inf within a layer or two


def check_finite(state: dict[str, torch.Tensor], where: str, error: type[Exception] = DrafterLoadError) -> None:
    """Refuse weights that cannot decode, naming the first such tensor: NaN / inf (a diverged run) or finite values
    beyond ±``WEIGHT_LIMIT`` (a damaged or rescaled file), whose products overflow to inf and NaN laws."""
    for name, t in state.items():
        if not t.is_floating_point() or not t.numel():
            continue
        if not bool(torch.isfinite(t).all()):
            raise error(f"{where}: tensor {name!r} has non-finite values (NaN or inf); did training diverge?")
        peak = float(t.detach().abs().max())
        if peak > WEIGHT_LIMIT:
            raise error(f"{where}: tensor {name!r} holds values up to {peak:.3g}, beyond ±{WEIGHT_LIMIT:g}: "
                        "these weights overflow when decoding (a damaged or rescaled file; re-export it)")  # fmt: skip


def read_config(path: str | Path) -> dict[str, Any]:
    """The drafter directory's config.json, after checking that the directory holds only files and folders (a FIFO or
    a device among them would block this read or the loader's later ones for ever)."""
    path = Path(path)
    regular_entries("drafter", path)
    f = path / "config.json"
    if not f.is_file():
        raise FileNotFoundError(f"{path} is not an exported drafter directory (no config.json)")
    try:
        cfg = json.loads(f.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise DrafterLoadError(f"{f} is not readable JSON ({exc}); re-export the drafter") from exc
    if not isinstance(cfg, dict):
        raise DrafterLoadError(f"{f} does not hold a JSON object")
    return cfg


def is_serving_config(cfg: dict[str, Any]) -> bool:
    """An HF-style config (``architectures``) rather than our own export (``format_version``)."""
    return "format_version" not in cfg and "architectures" in cfg


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


F = TypeVar("F", bound=Callable[..., Any])
# raised by our own checks with a message that names the problem (a UsageError: DrafterLoadError, RegistryError...),
# or by the system (files, memory, Ctrl-C): passed through unchanged
_OWN = (UsageError, OSError, KeyboardInterrupt, MemoryError, RecursionError)


def file_errors() -> tuple[type[BaseException], ...]:
    """What reading a damaged or inconsistent drafter raises from the libraries: a JSON, YAML or safetensors parse
    error, a value a constructor refuses (``ValueError``), a tensor of the wrong shape (torch's ``RuntimeError``
    from ``load_state_dict`` or a negative size). Not ``TypeError`` / ``AttributeError`` / ``KeyError``: our loaders
    check the type and presence of every field they read, so those are bugs and keep their traceback."""
    import yaml

    try:
        from safetensors import SafetensorError
    except ImportError:  # pragma: no cover (an older safetensors)
        SafetensorError = RuntimeError  # noqa: N806
    return (ValueError, RuntimeError, SafetensorError, yaml.YAMLError, OverflowError)


def artifact_entry(what: str) -> Callable[[F], F]:
    """For every entry point that reads a drafter's files (loaders, exporters): a library's error on a damaged or
    inconsistent file (:func:`file_errors`: a safetensors header, a tensor of the wrong shape, a value a part's
    constructor refuses) becomes one :class:`DrafterLoadError` naming the artifact, with the original as its
    ``__cause__`` (shown by ``DSPARK_TRACEBACK=1``), since the files, not the program, are what the user can fix.
    Our own usage errors and OS errors pass unchanged; anything else (a ``TypeError``, an ``AttributeError``: a bug
    in our code) propagates with its traceback."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def entry(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except _OWN:
                raise
            except file_errors() as exc:
                src = args[0] if args else next(iter(kwargs.values()), "?")
                src = getattr(src, "source_dir", src) if not isinstance(src, str | Path) else src
                raise DrafterLoadError(f"{what} {src} cannot be used ({type(exc).__name__}: {one_line(exc)[:300]})"
                                       ) from exc  # fmt: skip

        return entry  # type: ignore[return-value]

    return wrap


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _what(v: Any) -> str:
    return "null" if v is None else f"{short(v, 40)} ({type(v).__name__})"


def config_field(cfg: Any, key: str, kind: str, where: str, *, optional: bool = False, low: int | None = None) -> Any:
    """``cfg[key]`` of the kind a loader needs (``int``, ``str``, ``dict``, ``ints``: a list of ints, ``number``), or
    a :class:`DrafterLoadError` naming the file and the field. ``key`` may be dotted (``geometry.layer_ids``)."""
    node, path = cfg, key.split(".")
    for i, part in enumerate(path):
        if not isinstance(node, dict) or part not in node:
            if optional:
                return None
            raise DrafterLoadError(f"{where}: no {'.'.join(path[: i + 1])!r} field (not a complete config)")
        node = node[part]
    value = node
    if value is None and optional:
        return None
    ok = {
        "int": _is_int(value),
        "str": isinstance(value, str),
        "dict": isinstance(value, dict),
        "ints": isinstance(value, list) and all(_is_int(x) for x in value),
        "number": isinstance(value, int | float) and not isinstance(value, bool),
    }[kind]
    if ok and low is not None and kind == "int" and value < low:
        ok = False
    if not ok:
        want = {"int": "an integer", "str": "a string", "dict": "an object", "ints": "a list of integers",
                "number": "a number"}[kind] + (f" >= {low}" if low is not None else "")  # fmt: skip
        raise DrafterLoadError(f"{where}: {key} must be {want}, got {_what(value)}")
    return value


# The fields of an HF-style serving config.json that load_drafter and the layout readers read as integers, numbers
# or integer lists (DeepSpec's Qwen3DSparkModel and the layouts built like it).
SERVING_INTS = ("block_size", "mask_token_id", "vocab_size", "hidden_size", "num_hidden_layers", "num_target_layers")
SERVING_OPTIONAL_INTS = ("num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size", "num_anchors",
                         "markov_rank", "draft_vocab_size", "max_position_embeddings")  # fmt: skip
SERVING_NUMBERS = ("rms_norm_eps", "rope_theta")


def check_serving_config(cfg: dict[str, Any], where: str) -> None:
    """The typed fields of a serving config.json (:data:`SERVING_INTS` ...) that it holds: each of the type its
    readers need, else one :class:`DrafterLoadError` naming the file and the field (``block_size: null``, a nested
    ``target_layer_ids``). Missing keys are the layout reader's to name."""
    for key in SERVING_INTS:
        if key in cfg:
            config_field(cfg, key, "int", where)
    for key in SERVING_OPTIONAL_INTS:
        config_field(cfg, key, "int", where, optional=True)
    for key in SERVING_NUMBERS:
        config_field(cfg, key, "number", where, optional=True)
    if "target_layer_ids" in cfg:
        config_field(cfg, "target_layer_ids", "ints", where)


def check_native_config(cfg: dict[str, Any], where: str) -> None:
    """The fields of our own config.json that :func:`~.native.load_drafter` reads, each of the kind it needs (one
    :class:`DrafterLoadError` naming the file and the field otherwise)."""
    config_field(cfg, "target", "dict", where)
    config_field(cfg, "target.name", "str", where)
    config_field(cfg, "target.geometry.layer_ids", "ints", where)
    config_field(cfg, "target.chat", "dict", where, optional=True)
    config_field(cfg, "geometry", "dict", where)
    for key in ("hidden_size", "vocab_size"):
        config_field(cfg, f"geometry.{key}", "int", where, low=1)
    config_field(cfg, "geometry.layer_ids", "ints", where)
    config_field(cfg, "geometry.draft_vocab_size", "int", where, optional=True, low=1)
    config_field(cfg, "block_size", "int", where, low=1)
    config_field(cfg, "weights_sha256", "str", where)
    parts = ("drafter",) if "drafter" in cfg else ("backbone", "seq_head", "conf_head")
    if "drafter" not in cfg:
        config_field(cfg, "mask_token_id", "int", where)
    for part in parts:
        if part in ("drafter", "backbone") or cfg.get(part):
            config_field(cfg, part, "dict", where)
            config_field(cfg, f"{part}.class_path", "str", where)
            config_field(cfg, f"{part}.init_args", "dict", where, optional=True)


def place_drafter(drafter: Any, target: Any, device=None, dtype=None) -> Any:
    """Move ``drafter`` to ``device`` in ``dtype`` (defaults: the target's; ``auto``: the fastest there, see
    :func:`~dspark_lightning.devices.resolve_drafter_dtype`); refuse a device the target is not on.

    The draft-vocabulary buffer keeps its integer dtype (``Module.to(dtype)`` only converts floating tensors).
    """
    tdev = target.device
    dev = tdev if device is None else resolve_device(device)
    if dev != tdev and not (dev.type == tdev.type and (dev.index or 0) == (tdev.index or 0)):
        raise UsageError(
            f"drafter device {dev} differs from the target's ({tdev}): the drafter reads the target's embedding "
            "and LM head, so load the target on that device too (load_target(..., device=...))"
        )
    vocab = getattr(drafter, "draft_vocab", None)
    rows = vocab.numel() if vocab is not None else target.geometry.vocab_size
    from ..targets import cache_root

    want = resolve_drafter_dtype(dtype, tdev, target.dtype, target.geometry.hidden_size, rows, cache_root() / "kernels")
    return drafter.to(device=tdev, dtype=want)
