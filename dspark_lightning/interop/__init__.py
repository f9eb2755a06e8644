"""Deprecated: the serving layouts now live in :mod:`dspark_lightning.export` (one package for a drafter on disk).

``from dspark_lightning.interop import export_drafter`` and ``import dspark_lightning.interop.common`` (``convert``,
``dspark_hf``, ``eagle3_hf``, ``engines``) keep working: the names are re-exported and the submodules are the
``export`` package's own module objects. Import from ``dspark_lightning.export`` in new code.
"""

from __future__ import annotations

import sys

from ..export import (
    ENGINES,
    FORMATS,
    ExportResult,
    InteropError,
    common,
    convert,
    dspark_hf,
    eagle3_hf,
    engines,
    export_drafter,
    export_serving,
    is_serving_config,
    load_serving_drafter,
    run_export,
)

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

for _name, _module in {"common": common, "convert": convert, "dspark_hf": dspark_hf, "eagle3_hf": eagle3_hf,
                       "engines": engines}.items():  # fmt: skip
    sys.modules[f"{__name__}.{_name}"] = _module
