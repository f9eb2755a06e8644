"""A drafter on disk: our own format, and the layouts servers load (vLLM, SGLang, DeepSpec).

- native.py: :func:`save_drafter` / :func:`load_drafter` of our format (config.json + model.safetensors, hashed,
  rebuilt through the registry); files.py: what every layout shares (the load error, hashes, placement).
- convert.py: :func:`export_drafter` / :func:`export_serving` to ``native``, ``dspark-hf`` (``Qwen3DSparkModel``,
  dspark_hf.py) or ``eagle3-hf`` (``LlamaForCausalLMEagle3``, eagle3_hf.py), exact per server with ``server``
  (servers.py); a drafter a layout cannot represent raises :class:`InteropError` (common.py).
- serving.py: reading a serving directory back (what :func:`load_drafter` does for an HF-style config.json).
- cli.py: the ``dspark-lightning export`` command.

Imports neither Lightning nor the training stack, nor the runtime (``infer/`` imports this package, not the other
way round).
"""

from __future__ import annotations

from .cli import export_parser, run_export
from .common import InteropError
from .convert import FORMATS, ExportResult, export_drafter, export_serving
from .files import (
    EXPORT_TAG,
    FORMAT_VERSION,
    HASH_KEYS,
    OWN_FILES,
    DrafterLoadError,
    check_finite,
    config_sha256,
    is_serving_config,
    one_line,
    place_drafter,
    read_config,
    weights_sha256,
)
from .native import (
    check_chat_format,
    check_compatible,
    check_config_hash,
    load_drafter,
    load_drafter_checked,
    recorded_target_args,
    save_drafter,
)
from .servers import SERVERS
from .serving import load_serving_drafter

__all__ = [
    "SERVERS",
    "EXPORT_TAG",
    "FORMATS",
    "FORMAT_VERSION",
    "HASH_KEYS",
    "OWN_FILES",
    "DrafterLoadError",
    "ExportResult",
    "InteropError",
    "check_chat_format",
    "check_compatible",
    "check_config_hash",
    "check_finite",
    "config_sha256",
    "export_drafter",
    "export_parser",
    "export_serving",
    "is_serving_config",
    "load_drafter",
    "load_drafter_checked",
    "load_serving_drafter",
    "one_line",
    "place_drafter",
    "read_config",
    "recorded_target_args",
    "run_export",
    "save_drafter",
    "weights_sha256",
]
