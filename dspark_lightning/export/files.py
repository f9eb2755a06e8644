"""What every exported layout shares: the load error, the weight and config hashes, reading config.json, the
temp-folder tag of an export in progress, and placing a loaded drafter next to its target."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

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


def check_finite(state: dict[str, torch.Tensor], where: str, error: type[Exception] = DrafterLoadError) -> None:
    """Refuse NaN / inf weights (a diverged run) naming the first such tensor: they decode nothing useful."""
    for name, t in state.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise error(f"{where}: tensor {name!r} has non-finite values (NaN or inf); did training diverge?")


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
