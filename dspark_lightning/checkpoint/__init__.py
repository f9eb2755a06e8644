"""A drafter on disk in our own format, loaded and saved: what the runtime, training and export all read.

- native.py: :func:`save_drafter` / :func:`load_drafter` (config.json + model.safetensors, hashed, rebuilt through the
  registry; the calibration files beside them are read back too), the checks a drafter must pass against its target,
  and :func:`read_layout` for a serving directory (the registered ``layout`` readers).
- files.py: what every layout shares (the load error, hashes, reading config.json, placement next to the target).

Imports neither Lightning, nor the runtime, nor the exporters (``export/`` writes the serving layouts on top of this).
"""

from __future__ import annotations

from .files import (
    EXPORT_TAG,
    FORMAT_VERSION,
    HASH_KEYS,
    OWN_FILES,
    DrafterLoadError,
    artifact_entry,
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
    check_geometry,
    load_drafter,
    load_drafter_checked,
    load_target_and_drafters,
    read_layout,
    recorded_target_args,
    save_drafter,
)

__all__ = [
    "EXPORT_TAG",
    "FORMAT_VERSION",
    "HASH_KEYS",
    "OWN_FILES",
    "DrafterLoadError",
    "artifact_entry",
    "check_chat_format",
    "check_compatible",
    "check_geometry",
    "check_config_hash",
    "check_finite",
    "config_sha256",
    "is_serving_config",
    "load_drafter",
    "load_drafter_checked",
    "load_target_and_drafters",
    "one_line",
    "place_drafter",
    "read_config",
    "read_layout",
    "recorded_target_args",
    "save_drafter",
    "weights_sha256",
]
