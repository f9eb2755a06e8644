"""dspark-lightning: train and run DSpark speculative-decoding drafters."""

from __future__ import annotations

from typing import Any

from .registry import create, load_plugins, names

__version__ = "0.1.0"

__all__ = ["__version__", "create", "load_drafter", "load_plugins", "load_target", "names"]


def load_target(*args: Any, **kwargs: Any):
    """See :func:`dspark_lightning.targets.load_target`."""
    from .targets import load_target as _load

    return _load(*args, **kwargs)


def load_drafter(*args: Any, **kwargs: Any):
    """See :func:`dspark_lightning.checkpoint.load_drafter`."""
    from .checkpoint import load_drafter as _load

    return _load(*args, **kwargs)
