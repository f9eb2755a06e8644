"""How a user error is shown: one line (shared by the console script, cli/, and the Lightning commands)."""

from __future__ import annotations

import re


def one_line_error(exc: BaseException) -> str:
    """The exception's message with its lines joined (the type's name for an empty message), with jsonargparse's
    phrasing said as a user reads it: ``Parser key "name"`` is the flag ``--name``, and a closed choice's
    ``Expected a typing.Literal['a', 'b']. Got value: x`` is ``'x' is not one of a, b``."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = " ".join(lines) if lines else type(exc).__name__
    text = re.sub(r'Parser key "([\w.]+)"( element \d+)?:', r"--\1\2:", text)
    choices = r"(?:Does not validate against any of the Union subtypes .*?)?Expected a typing\.Literal\[([^\]]*)\]"
    choices += r"(?:\. Got value: | .*Given value: )(.*?)$"  # a choice, or an optional one (a union with None)
    return re.sub(choices, lambda m: f"{m.group(2)!r} is not one of {m.group(1).replace(chr(39), '')}", text)
