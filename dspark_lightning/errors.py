"""How a user error is shown: one line (shared by the console script, cli/, and the Lightning commands)."""

from __future__ import annotations


def one_line_error(exc: BaseException) -> str:
    """The exception's message with its lines joined (the type's name for an empty message); jsonargparse's
    ``Parser key "name":`` is said as the flag, ``--name:``."""
    import re

    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = " ".join(lines) if lines else type(exc).__name__
    return re.sub(r'Parser key "([\w.]+)":', r"--\1:", text)
