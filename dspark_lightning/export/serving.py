"""Reading a serving layout back: what :func:`~dspark_lightning.export.load_drafter` calls for a directory whose
config.json names an HF architecture instead of our ``format_version`` (DeepSpec's checkpoints, sharded or not)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .dspark_hf import is_dspark_config, load_dspark_hf
from .files import DrafterLoadError, is_serving_config, place_drafter

__all__ = ["is_serving_config", "load_serving_drafter"]


def load_serving_drafter(path: str | Path, cfg: dict[str, Any], target: Any, device=None, dtype=None):
    """A working drafter from a serving directory, placed like :func:`~dspark_lightning.export.load_drafter` does."""
    path = Path(path)
    if not is_dspark_config(cfg):
        raise DrafterLoadError(
            f"{path / 'config.json'}: architectures {cfg.get('architectures')} is not a layout load_drafter reads "
            "(ours, or Qwen3DSparkModel / DSparkDraftModel with model_type qwen3)"
        )
    drafter = load_dspark_hf(path, cfg, target)
    drafter.source_dir = str(path)
    return place_drafter(drafter, target, device, dtype).eval()
