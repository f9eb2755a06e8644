"""Reading a serving layout back: the ``layout`` readers that :func:`~dspark_lightning.checkpoint.load_drafter` asks
for a directory whose config.json names an HF architecture instead of our ``format_version``.

A third-party layout registers the same two functions: ``@register("layout", "name")`` on a class (or object) with
``claims(cfg) -> bool`` and ``read(path, cfg, target) -> Drafter``; ``load_drafter`` places the drafter and checks its
weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..registry import register
from .dspark_hf import is_dspark_config, load_dspark_hf


@register("layout", "dspark-hf")
class DSparkHFLayout:
    """DeepSpec's ``Qwen3DSparkModel`` / ``DSparkDraftModel`` directories (sharded or not), and our ``dspark-hf``
    export of them."""

    @staticmethod
    def claims(cfg: dict[str, Any]) -> bool:
        return is_dspark_config(cfg)

    @staticmethod
    def read(path: str | Path, cfg: dict[str, Any], target: Any):
        return load_dspark_hf(Path(path), cfg, target)
