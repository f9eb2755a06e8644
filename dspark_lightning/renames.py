"""Names that changed, kept working with a notice: a keyword of the Python API, a keyword a plugin's factory takes,
and a command's flag (``cli/signature.py``). CHANGELOG lists every rename.

    batching = renamed_keyword("decode()", "layout", "batching", layout, batching, "padded")
    create("verifier", name, target, **keyword_for(get("verifier", name), "batching", "layout", batching))
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from typing import Any


def renamed_keyword(where: str, old: str, new: str, old_value: Any, new_value: Any, default: Any) -> Any:
    """The value of keyword ``new``, formerly named ``old`` (``old_value`` None: not given). Given by its former name
    only, that value is used and a DeprecationWarning names the new one; given by both names, a ValueError."""
    if old_value is None:
        return new_value
    if new_value != default:
        raise ValueError(f"{where}: give {new}= only ({old}= is its former name)")
    warnings.warn(f"{where}: {old}= is now {new}= (the former name will be removed)", DeprecationWarning, stacklevel=3)
    return old_value


def accepts(func: Callable, name: str) -> bool:
    """Whether ``func`` (a function or a class) takes a keyword ``name``, by name or through ``**kwargs``."""
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):  # a builtin without a signature: assume the current name
        return True
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def keyword_for(factory: Callable, new: str, old: str, value: Any) -> dict[str, Any]:
    """``{new: value}``, or ``{old: value}`` with a DeprecationWarning for a factory (a plugin's) written before the
    keyword was renamed: one that takes ``old`` but not ``new``."""
    if accepts(factory, new) or not accepts(factory, old):
        return {new: value}
    name = getattr(factory, "__qualname__", repr(factory))
    warnings.warn(f"{name} takes {old}=, now named {new}=; rename its parameter (the former name will be removed)",
                  DeprecationWarning, stacklevel=3)  # fmt: skip
    return {old: value}
