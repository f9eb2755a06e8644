"""How a user error is shown: one line (shared by the console script, cli/, and the Lightning commands)."""

from __future__ import annotations


def one_line_error(exc: BaseException) -> str:
    """The exception's message with its lines joined (the type's name for an empty message)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return " ".join(lines) if lines else type(exc).__name__
