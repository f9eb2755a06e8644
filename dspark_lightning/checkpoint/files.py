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

from ..checks import regular_entries
from ..devices import resolve_device, resolve_drafter_dtype

FORMAT_VERSION = 1
HASH_KEYS = ("weights_sha256", "config_sha256")
EXPORT_TAG = "export-"  # temp folders are .<name>.export-tmp-<pid>-*, a swapped-out one .<name>.export-old-<pid>-*
OWN_FILES = ("config.json", "model.safetensors")


class DrafterLoadError(ValueError):
    """An exported drafter that cannot be used with the given target."""


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
        raise DrafterLoadError(f"{f} is not readable JSON ({exc}); re-export the drafter") from None
    if not isinstance(cfg, dict):
        raise DrafterLoadError(f"{f} does not hold a JSON object")
    return cfg


def is_serving_config(cfg: dict[str, Any]) -> bool:
    """An HF-style config (``architectures``) rather than our own export (``format_version``)."""
    return "format_version" not in cfg and "architectures" in cfg


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


F = TypeVar("F", bound=Callable[..., Any])
# raised by our own checks with a message that names the problem (ValueError covers DrafterLoadError, InteropError
# and UsageError), or by the system (files, memory, Ctrl-C): passed through unchanged
_OWN = (ValueError, OSError, NotImplementedError, KeyboardInterrupt, MemoryError, RecursionError)


def artifact_entry(what: str) -> Callable[[F], F]:
    """For every entry point that reads a drafter's files (loaders, exporters): a failure that is not one of our
    own checks (a library's error on a damaged or inconsistent file: a safetensors header, a tensor of the wrong
    shape, a config value of the wrong type) becomes one :class:`DrafterLoadError` naming the artifact, since the
    files, not the program, are what the user can fix."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def entry(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except _OWN:
                raise
            except Exception as exc:  # noqa: BLE001 - see the docstring: any other failure comes from the files
                src = args[0] if args else next(iter(kwargs.values()), "?")
                src = getattr(src, "source_dir", src) if not isinstance(src, str | Path) else src
                raise DrafterLoadError(f"{what} {src} cannot be used ({type(exc).__name__}: {one_line(exc)[:300]})"
                                       ) from None  # fmt: skip

        return entry  # type: ignore[return-value]

    return wrap


def place_drafter(drafter: Any, target: Any, device=None, dtype=None) -> Any:
    """Move ``drafter`` to ``device`` in ``dtype`` (defaults: the target's; ``auto``: the fastest there, see
    :func:`~dspark_lightning.devices.resolve_drafter_dtype`); refuse a device the target is not on.

    The draft-vocabulary buffer keeps its integer dtype (``Module.to(dtype)`` only converts floating tensors).
    """
    tdev = target.device
    dev = tdev if device is None else resolve_device(device)
    if dev != tdev and not (dev.type == tdev.type and (dev.index or 0) == (tdev.index or 0)):
        raise ValueError(
            f"drafter device {dev} differs from the target's ({tdev}): the drafter reads the target's embedding "
            "and LM head, so load the target on that device too (load_target(..., device=...))"
        )
    vocab = getattr(drafter, "draft_vocab", None)
    rows = vocab.numel() if vocab is not None else target.geometry.vocab_size
    want = resolve_drafter_dtype(dtype, tdev, target.dtype, target.geometry.hidden_size, rows)
    return drafter.to(device=tdev, dtype=want)
