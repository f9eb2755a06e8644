"""Save / load a drafter as a directory: config.json + model.safetensors (+ calibration.json later).

The directory records the block convention, the target name, its layer ids and chat format, the
registered names and hyperparameters of every part, and a SHA-256 of the weights. Loading
rebuilds the parts through the registry (no pickles) and refuses a mismatched target.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from .calibration import load_calibrations
from .drafters import CONVENTION, Drafter, build_part, compose, draft_geometry
from .drafters.drafter import check_draft_vocab
from .registry import create

FORMAT_VERSION = 1


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


def save_drafter(
    drafter: Drafter,
    path: str | Path,
    target: Any,
    extra: dict[str, Any] | None = None,
    overwrite: bool = False,
    state: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write ``path/config.json`` and ``path/model.safetensors``. Refuses a non-empty directory unless ``overwrite``.

    ``state``: the weights to write (default ``drafter.state_dict()``), e.g. the full state gathered from FSDP shards.
    """
    path = Path(path)
    if path.exists() and any(path.iterdir()) and not overwrite:
        raise FileExistsError(f"export directory {path} is not empty; refusing to overwrite it")
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in (drafter.state_dict() if state is None else state).items()}
    cfg = {
        "format_version": FORMAT_VERSION,
        "target": target.describe(),
        **drafter.config(),
        "weights_sha256": weights_sha256(state),
        **(extra or {}),
    }
    save_file(state, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return path


def read_config(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    f = path / "config.json"
    if not f.is_file():
        raise FileNotFoundError(f"{path} is not an exported drafter directory (no config.json)")
    return json.loads(f.read_text())


def check_compatible(cfg: dict[str, Any], target: Any, where: str) -> None:
    """One-line errors for a drafter whose geometry does not match the target."""
    g, tg = cfg["geometry"], target.geometry
    for key in ("hidden_size", "vocab_size"):
        if g[key] != getattr(tg, key):
            raise DrafterLoadError(
                f"{where}: drafter {key}={g[key]} does not match target {target.name!r} {key}={getattr(tg, key)}"
            )
    if list(g["layer_ids"]) != list(tg.layer_ids):
        raise DrafterLoadError(
            f"{where}: drafter was trained on target layers {g['layer_ids']}, target taps {list(tg.layer_ids)}"
        )
    if cfg.get("convention", CONVENTION) != CONVENTION:
        raise DrafterLoadError(f"{where}: block convention {cfg.get('convention')!r}, this runtime uses {CONVENTION!r}")


def load_drafter(
    path: str | Path,
    target: Any = None,
    map_location: str | torch.device | None = None,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
) -> Drafter:
    """Rebuild an exported drafter. ``target`` defaults to the one recorded in config.json.

    ``device`` (``map_location`` is its older name): where the drafter runs, default the target's device (the
    drafter shares the target's embedding and LM head, so both must be on one device). ``dtype``: the drafter's
    weights, default the target's dtype; its precision never affects losslessness (the laws are fp32).
    A serving ``Qwen3DSparkModel`` directory (DeepSpec, ``dspark-lightning export --format dspark-hf``) is read
    too; it records no target of ours, so pass ``target``.
    """
    from .targets import ChatFormat, TargetGeometry, load_target

    path = Path(path)
    cfg = read_config(path)
    from .interop import is_serving_config, load_serving_drafter

    if is_serving_config(cfg):  # a serving layout (DeepSpec / vLLM / SGLang), see interop/
        return load_serving_drafter(path, cfg, target, device if device is not None else map_location, dtype)
    if cfg.get("format_version") != FORMAT_VERSION:
        raise DrafterLoadError(f"{path}: unsupported format_version {cfg.get('format_version')}")
    tmeta = cfg["target"]
    if target is None:
        target = load_target(tmeta["name"], layer_ids=tmeta["geometry"]["layer_ids"], chat=ChatFormat(**tmeta["chat"]))
    check_compatible(cfg, target, str(path))
    g: TargetGeometry = target.geometry
    if "drafter" in cfg:  # a drafter that is one registered piece (eagle3, mtp1)
        drafter = create("drafter", cfg["drafter"], target, block_size=cfg["block_size"], **cfg["drafter_args"])
    else:
        n_vocab = cfg["geometry"].get("draft_vocab_size")
        g = draft_geometry(target, n_vocab)
        bb = build_part("backbone", cfg["backbone"], g)
        sh = build_part("seq_head", cfg["seq_head"], g)
        ch = build_part("conf_head", cfg["conf_head"], g, getattr(sh, "token_dim", 0)) if cfg["conf_head"] else None
        drafter = compose(target, bb, sh, ch, cfg["block_size"], cfg["mask_token_id"], n_vocab)
    state = load_file(str(path / "model.safetensors"), device="cpu")
    if weights_sha256(state) != cfg["weights_sha256"]:
        raise DrafterLoadError(f"{path}/model.safetensors does not match the weights hash in config.json")
    drafter.load_state_dict(state, strict=True)
    vocab = getattr(drafter, "draft_vocab", None)
    if vocab is not None:
        try:
            check_draft_vocab(vocab, vocab.numel(), target.geometry.vocab_size)
        except ValueError as exc:
            raise DrafterLoadError(f"{path}: invalid draft vocabulary: {exc}") from None
    drafter = place_drafter(drafter, target, device if device is not None else map_location, dtype)
    drafter.source_dir = str(path)
    drafter.calibrations = load_calibrations(path, cfg["weights_sha256"])  # {sampling T: STS temperatures}
    return drafter.eval()


def place_drafter(drafter: Drafter, target: Any, device=None, dtype=None) -> Drafter:
    """Move ``drafter`` to ``device`` in ``dtype`` (defaults: the target's); refuse a device the target is not on.

    The draft-vocabulary buffer keeps its integer dtype (``Module.to(dtype)`` only converts floating tensors).
    """
    from .devices import resolve_device, resolve_dtype

    tdev = target.device
    dev = tdev if device is None else resolve_device(device)
    if dev != tdev and not (dev.type == tdev.type and (dev.index or 0) == (tdev.index or 0)):
        raise ValueError(
            f"drafter device {dev} differs from the target's ({tdev}): the drafter reads the target's embedding "
            "and LM head, so load the target on that device too (load_target(..., device=...))"
        )
    return drafter.to(device=tdev, dtype=target.dtype if dtype is None else resolve_dtype(dtype, tdev))
