"""How an error is shown (shared by the console script, cli/, and the Lightning commands).

A :class:`~dspark_lightning.checks.UsageError` (and its subclasses) is what the user can fix: one line, exit code 2.
Any other exception is a bug and keeps its traceback. ``DSPARK_TRACEBACK=1`` adds the traceback, with its chained
cause, to a usage error too (:func:`traceback_wanted`, :func:`print_traceback`).
"""

from __future__ import annotations

import os
import re
import sys
import traceback

TRACEBACK_ENV = "DSPARK_TRACEBACK"


def traceback_wanted() -> bool:
    """``DSPARK_TRACEBACK`` is set to something other than ``0``: show tracebacks behind the one-line errors."""
    return os.environ.get(TRACEBACK_ENV, "") not in ("", "0")


def print_traceback(exc: BaseException) -> None:
    """The traceback of ``exc`` with its chained cause / context, on stderr (a closed stderr prints nothing)."""
    try:
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


_TYPE_NAMES = {"int": "an int", "float": "a float", "bool": "a bool (true or false)", "str": "a string"}
# jsonargparse's error for a value that fits no member of a union: one "- ..." line per member it tried. Where a
# member names a nested key with a plain type ("Parser key "rank": Expected a <class 'int'>. Got value: 16x"), that
# is what the user got wrong; the other members' errors are noise.
_UNION = re.compile(r'Parser key "([\w.]+)"(?: element \d+)?:\s+Does not validate against any of the Union subtypes')
_GOT = r"Expected a <class '(\w+)'>\.? Got value: (.*?)(?:\. Got value: |$)"  # the value, up to the next one
_NESTED = re.compile(r'(?:Parser key|Key) "([\w.]+)":\s*' + _GOT, re.M)
_PLAIN = re.compile(r'^Parser key "([\w.]+)"((?: element \d+)?):\s*' + _GOT, re.M)


_MEMBERS = re.compile(r"Subtypes: \[(.*?)\]\s+Errors:.*Given value: (.*?)\s*$", re.S)


def _type_name(member: str) -> str:
    """``<class 'datetime.timedelta'>`` -> ``timedelta``, ``<class 'NoneType'>`` -> ``null`` (as YAML writes it)."""
    name = re.sub(r"<class '(?:[\w]+\.)*(\w+)'>", r"\1", member.strip())
    return "null" if name == "NoneType" else name


def _union_error(text: str) -> str | None:
    """One line for jsonargparse's whole union dump: ``--model.seq_head.rank: expected an int, got '16x'`` when one
    of the members it tried names a nested key of a plain type, else the members and the value
    (``--trainer.max_time: expected str | timedelta | dict[str, int] | null, got {'minutes': 5.5}``); None for
    another error."""
    outer = _UNION.search(text)
    if outer is None:
        return None
    for key, typ, got in _NESTED.findall(text[outer.end() :]):
        if typ in _TYPE_NAMES:
            return f"--{outer.group(1)}.{key}: expected {_TYPE_NAMES[typ]}, got {got.strip()!r}"
    members = _MEMBERS.search(text, outer.end())
    if members is None or "Literal[" in members.group(1):  # an optional choice: said as a choice below
        return None
    kinds = re.split(r",\s*(?![^\[]*\])", members.group(1))  # commas outside a member's own brackets
    return f"--{outer.group(1)}: expected {' | '.join(map(_type_name, kinds))}, got {members.group(2)}"


def user_error_within(exc: BaseException) -> BaseException | None:
    """The :class:`~dspark_lightning.checks.UsageError` a component's constructor raised under ``exc`` (jsonargparse
    wraps it in a ValueError listing every type of a union it tried), or None."""
    from .checks import UsageError

    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, UsageError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def one_line_error(exc: BaseException) -> str:
    """The exception's message with its lines joined (the type's name for an empty message), with jsonargparse's
    phrasing said as a user reads it: ``Parser key "name"`` is the flag ``--name``, a closed choice's
    ``Expected a typing.Literal['a', 'b']. Got value: x`` is ``'x' is not one of a, b``, a plain type's
    ``Expected a <class 'int'>. Got value: x`` is ``expected an int, got 'x'``, and a union whose members all failed
    names the nested key at fault (``--model.seq_head.rank: expected an int, got '16x'``) instead of every member's
    error."""
    raw = str(exc)
    union = _union_error(raw)
    if union is not None:
        return union
    plain = _PLAIN.search(raw)
    if plain is not None and plain.group(3) in _TYPE_NAMES and "Union subtypes" not in raw:
        key, element, typ, got = plain.groups()
        return f"--{key}{element}: expected {_TYPE_NAMES[typ]}, got {got.strip()!r}"
    lines = [ln.strip() for ln in raw.splitlines() if ln.strip()]
    text = " ".join(lines) if lines else type(exc).__name__
    text = re.sub(r'Parser key "([\w.]+)"( element \d+)?:', r"--\1\2:", text)
    choices = r"(?:Does not validate against any of the Union subtypes .*?)?Expected a typing\.Literal\[([^\]]*)\]"
    choices += r"(?:\. Got value: | .*Given value: )(.*?)$"  # a choice, or an optional one (a union with None)
    return re.sub(choices, lambda m: f"{m.group(2)!r} is not one of {m.group(1).replace(chr(39), '')}", text)
