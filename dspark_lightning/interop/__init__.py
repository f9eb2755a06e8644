"""Serving interop: write our drafters in the layouts vLLM / SGLang / DeepSpec load, and read DeepSpec's back.

- ``export_drafter`` / ``dspark-lightning export``: ``native``, ``dspark-hf`` (``Qwen3DSparkModel``) or
  ``eagle3-hf`` (``LlamaForCausalLMEagle3``); a drafter a layout cannot represent raises :class:`InteropError`.
  ``engine`` (``--engine``: one of :data:`ENGINES`) makes the export exact for vLLM, SGLang or DeepSpec (engines.py).
- ``load_serving_drafter``: what :func:`dspark_lightning.export.load_drafter` calls for a directory whose
  config.json names an HF architecture instead of our ``format_version`` (DeepSpec's checkpoints, sharded or not).

Imports neither Lightning nor the training stack.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .common import InteropError
from .convert import FORMATS, ExportResult, export_drafter, export_serving, run_export
from .dspark_hf import is_dspark_config, load_dspark_hf
from .engines import ENGINES

__all__ = [
    "ENGINES",
    "FORMATS",
    "ExportResult",
    "InteropError",
    "export_drafter",
    "export_serving",
    "is_serving_config",
    "load_serving_drafter",
    "run_export",
]


def is_serving_config(cfg: dict[str, Any]) -> bool:
    """An HF-style config (``architectures``) rather than our own export (``format_version``)."""
    return "format_version" not in cfg and "architectures" in cfg


def load_serving_drafter(path: str | Path, cfg: dict[str, Any], target: Any, device=None, dtype=None):
    """A working drafter from a serving directory, placed like :func:`~dspark_lightning.export.load_drafter` does."""
    from ..export import DrafterLoadError, place_drafter

    path = Path(path)
    if not is_dspark_config(cfg):
        raise DrafterLoadError(
            f"{path / 'config.json'}: architectures {cfg.get('architectures')} is not a layout load_drafter reads "
            "(ours, or Qwen3DSparkModel / DSparkDraftModel with model_type qwen3)"
        )
    drafter = load_dspark_hf(path, cfg, target)
    drafter.source_dir = str(path)
    return place_drafter(drafter, target, device, dtype).eval()
