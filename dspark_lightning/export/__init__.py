"""A drafter in the layouts servers load (vLLM, SGLang, DeepSpec, llama.cpp).

Our own format (save / load, hashes, placement) is :mod:`dspark_lightning.checkpoint`, below this package.

- convert.py: :func:`export_drafter` / :func:`export_serving` to ``native``, ``dspark-hf`` (``Qwen3DSparkModel``,
  dspark_hf.py) or ``eagle3-hf`` (``LlamaForCausalLMEagle3``, eagle3_hf.py), exact per server with ``server``
  (servers.py: each server's :class:`Rules` keyed by layout name); a drafter a layout cannot represent raises
  :class:`InteropError` (common.py).
- layouts.py: the registered serving layouts (kind ``layout``): what ``export --layout`` writes, and the readers
  :func:`~dspark_lightning.checkpoint.load_drafter` uses for an HF-style config.json.

Imports neither Lightning nor the training stack, nor the runtime; the runtime loads drafters through
``checkpoint/``, never through this package.
"""

from __future__ import annotations

from .common import InteropError
from .convert import ExportResult, export_drafter, export_serving
from .layouts import Layout, serving_layouts
from .servers import ExportJob, Rules, Server, server_for, server_names

__all__ = [
    "ExportResult",
    "ExportJob",
    "InteropError",
    "Layout",
    "Rules",
    "Server",
    "export_drafter",
    "export_serving",
    "server_for",
    "server_names",
    "serving_layouts",
]
