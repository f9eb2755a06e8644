"""A command's parser, generated from a typed, documented function: one ``--name`` flag per parameter.

    def export(drafter: str, out: str, format: str = "dspark-hf", overwrite: bool = False) -> None:
        \"\"\"Write a drafter in a layout servers load.

        Args:
            drafter: exported drafter directory
            out: output directory
            format: native | dspark-hf | eagle3-hf
            overwrite: replace an existing export in --out
        \"\"\"

    run(export, ["--drafter", "d", "--out", "o", "--overwrite"], "dspark-lightning export")

A flag's type is its parameter's annotation (jsonargparse checks the value: ``int``, ``float``, ``str | None``,
``Literal[...]``...), its default the parameter's (a parameter without one is a required flag), its help the
parameter's entry in the docstring's ``Args:`` section (else its entry in :data:`COMMON_HELP`, the flags that mean the
same in every command), and the docstring's summary is the command's description.
A sequence (``Sequence[str]``, ``list[int]``) takes one or more values (``--domains math code``); annotated as
``Annotated[Sequence[str], REPEATED]`` it is given once per value instead (``--prompt a --prompt b``). A ``bool`` is
a switch: ``--overwrite`` alone, or ``--overwrite true|false``. A parameter typed by a (keyword-only) dataclass is a
group of options several commands share: its fields are flags of their own (``--out``, not ``--common.out``),
documented in its docstring, and the function receives the dataclass built from them (its constructor checks them).
"""

from __future__ import annotations

import collections.abc
import dataclasses
import inspect
import typing
from collections.abc import Callable, Collection, Mapping
from typing import Annotated, Any

import docstring_parser
from jsonargparse import ArgumentParser

REPEATED = "repeated"  # Annotated[Sequence[X], REPEATED]: a flag given once per value
COMMON_HELP = {  # a flag's help where its function's docstring has none: flags with one meaning in every command
    "device": "auto (CUDA when available) | cpu | cuda | cuda:N",
    "dtype": "target: auto (bf16 on CUDA, fp32 on CPU) | bf16 | fp32",
    "drafter_dtype": "drafter: auto (the faster of fp32/bf16 here) | bf16 | fp32",
    "seed": "random seed of the sampling",
    "out": "output directory",
    "domains": "built-in held-out sets",
}
SEQUENCES = (list, tuple, collections.abc.Sequence)


def arg_help(func: Callable) -> dict[str, str]:
    """Parameter name -> its ``Args:`` entry in ``func``'s docstring on one line (a class's: also its bases'), else
    its :data:`COMMON_HELP`."""
    own = {}
    for owner in reversed(func.__mro__) if isinstance(func, type) else (func,):
        doc = docstring_parser.parse(inspect.getdoc(owner) or "")
        own |= {p.arg_name: " ".join(p.description.split()) for p in doc.params if p.description}
    params = inspect.signature(func).parameters
    return {**{k: v for k, v in COMMON_HELP.items() if k in params}, **own}


def description(func: Callable) -> str:
    """The docstring without its ``Args:`` / ``Returns:`` sections."""
    doc = docstring_parser.parse(inspect.getdoc(func) or "")
    return "\n\n".join(part for part in (doc.short_description, doc.long_description) if part)


def flag_kwargs(hint: Any, default: Any) -> dict[str, Any]:
    """``ArgumentParser.add_argument`` keywords for a parameter annotated ``hint`` with ``default``
    (``inspect.Parameter.empty``: none, the flag is required)."""
    repeated = typing.get_origin(hint) is Annotated and REPEATED in hint.__metadata__
    if typing.get_origin(hint) is Annotated:
        hint = typing.get_args(hint)[0]
    out: dict[str, Any] = {"required": True} if default is inspect.Parameter.empty else {"default": default}
    if typing.get_origin(hint) in SEQUENCES:
        out["type"] = typing.get_args(hint)[0]
        if repeated:
            out["action"] = "append"
        else:
            out["nargs"] = "+"
        if "default" in out and default is not None:
            out["default"] = list(default)
    elif hint is bool:
        out |= {"type": bool, "nargs": "?", "const": True}
    else:
        out["type"] = hint
    return out


def flag_parameters(func: Callable, skip: Collection[str] = ()) -> list[inspect.Parameter]:
    """The parameters of ``func`` that are flags: all but those in ``skip`` and ``*args`` / ``**kwargs``."""
    params = inspect.signature(func).parameters.values()
    return [p for p in params if p.name not in skip and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def group_type(hint: Any) -> type | None:
    """The dataclass a parameter annotated ``hint`` is typed by (a group of shared options), else None."""
    return hint if isinstance(hint, type) and dataclasses.is_dataclass(hint) else None


def add_function_flags(
    parser: ArgumentParser, func: Callable, skip: Collection[str] = (), flags: Mapping[str, str] | None = None
) -> None:
    """Add a flag for each parameter of ``func`` but those in ``skip`` (for a dataclass-typed one, a flag per field);
    ``flags``: parameter -> another flag name. A parameter without help in the docstring or :data:`COMMON_HELP` is
    a TypeError (every flag is documented)."""
    helps, hints = arg_help(func), typing.get_type_hints(func, include_extras=True)
    for param in flag_parameters(func, skip):
        if (group := group_type(hints[param.name])) is not None:
            add_function_flags(parser, group)
            continue
        if param.name not in helps:
            raise TypeError(f"{func.__qualname__}: parameter {param.name!r} has no entry in the docstring's Args:")
        flag = (flags or {}).get(param.name, param.name)
        parser.add_argument(f"--{flag}", help=helps[param.name], **flag_kwargs(hints[param.name], param.default))


def command_parser(
    func: Callable, prog: str, skip: Collection[str] = (), flags: Mapping[str, str] | None = None
) -> ArgumentParser:
    """The parser of the command ``prog`` that calls ``func`` (bad input raises ArgumentError, no exit)."""
    parser = ArgumentParser(prog=prog, description=description(func), exit_on_error=False)
    add_function_flags(parser, func, skip, flags)
    return parser


def function_kwargs(
    cfg: Any, func: Callable, skip: Collection[str] = (), flags: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The keyword arguments of ``func`` from a namespace parsed by a parser :func:`add_function_flags` built (a
    dataclass-typed parameter built from its fields' flags)."""
    out, hints = {}, typing.get_type_hints(func)
    for p in flag_parameters(func, skip):
        group = group_type(hints.get(p.name))
        out[p.name] = group(**function_kwargs(cfg, group)) if group else cfg[(flags or {}).get(p.name, p.name)]
    return out


def run(
    func: Callable, argv: list[str], prog: str, skip: Collection[str] = (), flags: Mapping[str, str] | None = None
) -> Any:
    """Parse ``argv`` with the parser generated from ``func`` and call it with the values."""
    cfg = command_parser(func, prog, skip, flags).parse_args(argv)
    return func(**function_kwargs(cfg, func, skip, flags))
