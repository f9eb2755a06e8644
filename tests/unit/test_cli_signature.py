"""The parser generated from a typed, documented function (dspark_lightning/cli/signature.py): a flag per
parameter with the annotation's type, the signature's default, the docstring's help; bad values are one-line
errors."""

from __future__ import annotations

from argparse import ArgumentError
from collections.abc import Sequence
from typing import Annotated, Literal

import pytest

from dspark_lightning.cli.signature import REPEATED, command_parser, run
from dspark_lightning.errors import one_line_error


def toy(
    drafter: str,
    *,
    steps: int = 8,
    rate: float | None = None,
    domains: Sequence[str] = ("math", "code"),
    prompt: Annotated[Sequence[str], REPEATED] = (),
    mode: Literal["fast", "exact"] = "exact",
    overwrite: bool = False,
) -> dict:
    """Run the toy command.

    Args:
        drafter: exported drafter directory
        steps: how many steps
        rate: a rate (default: none)
        domains: built-in sets,
            on two lines
        prompt: a prompt (repeatable)
        mode: fast or exact
        overwrite: replace an existing output
    """
    return dict(locals())


def _actions(func=toy):
    return {a.dest: a for a in command_parser(func, "toy")._actions if a.dest != "help"}


def test_flags_have_the_signature_types_defaults_and_help():
    acts = _actions()
    assert list(acts) == ["drafter", "steps", "rate", "domains", "prompt", "mode", "overwrite"]
    assert acts["drafter"].required and acts["drafter"].help == "exported drafter directory"
    assert not acts["steps"].required and acts["steps"].default == 8
    assert acts["domains"].default == ["math", "code"] and acts["domains"].nargs == "+"
    assert acts["domains"].help == "built-in sets, on two lines"  # the docstring's lines joined
    assert acts["prompt"].default == [] and acts["rate"].default is None and acts["overwrite"].default is False
    parser = command_parser(toy, "toy")
    assert parser.description == "Run the toy command."
    assert "how many steps" in parser.format_help()


def test_values_are_parsed_by_type_and_passed_to_the_function():
    got = run(toy, ["--drafter", "d", "--steps", "3", "--rate", "0.5", "--domains", "chat", "math", "--prompt", "a",
                    "--prompt", "b c", "--mode", "fast", "--overwrite"], "toy")  # fmt: skip
    assert got == {"drafter": "d", "steps": 3, "rate": 0.5, "domains": ["chat", "math"], "prompt": ["a", "b c"],
                   "mode": "fast", "overwrite": True}  # fmt: skip
    defaults = run(toy, ["--drafter", "d", "--overwrite", "false"], "toy")
    assert defaults == {"drafter": "d", "steps": 8, "rate": None, "domains": ["math", "code"], "prompt": [],
                        "mode": "exact", "overwrite": False}  # fmt: skip


def test_a_renamed_or_skipped_parameter():
    def g(path: str, quiet: bool = False) -> tuple:
        """G.

        Args:
            path: a file
            quiet: print nothing
        """
        return path, quiet

    assert run(g, ["--file", "x"], "g", skip={"quiet"}, flags={"path": "file"}) == ("x", False)
    assert "--quiet" not in command_parser(g, "g", skip={"quiet"}).format_help()


@pytest.mark.parametrize(
    "argv, word",
    [(["--steps", "3"], "drafter"), (["--drafter", "d", "--steps", "x"], "steps"),
     (["--drafter", "d", "--mode", "slow"], "mode"), (["--drafter", "d", "--rate", "fast"], "rate"),
     (["--drafter", "d", "--overwrite", "maybe"], "overwrite"), (["--drafter", "d", "--bogus", "1"], "bogus")],
)  # fmt: skip
def test_a_bad_value_is_a_one_line_error_naming_the_flag(argv, word):
    with pytest.raises(ArgumentError) as info:
        run(toy, argv, "toy")
    line = one_line_error(info.value)
    assert "\n" not in line and word in line


def test_a_closed_choice_is_refused_with_its_choices():
    def k(mode: Literal["fast", "exact"] = "exact", part: Literal["a", "b"] | None = None,
          sets: Sequence[Literal["x", "y"]] = ("x",)) -> None:  # fmt: skip
        """K.

        Args:
            mode: fast or exact
            part: a or b
            sets: x and / or y
        """

    for argv, want in ((["--mode", "slow"], "--mode: 'slow' is not one of fast, exact"),
                       (["--part", "c"], "--part: 'c' is not one of a, b"),
                       (["--sets", "x", "z"], "--sets element 2: 'z' is not one of x, y")):  # fmt: skip
        with pytest.raises(ArgumentError) as info:
            run(k, argv, "k")
        assert one_line_error(info.value) == want


def test_an_undocumented_parameter_is_refused():
    def h(x: int = 1, y: int = 2) -> None:
        """H.

        Args:
            x: documented
        """

    with pytest.raises(TypeError, match="'y'"):
        command_parser(h, "h")


def test_a_common_flag_takes_its_help_from_the_glossary_unless_the_docstring_has_its_own():
    def cmd(seed: int = 0, device: str = "auto", out: str = "o") -> None:
        """A command.

        Args:
            out: where the table goes
        """

    helps = {a.dest: a.help for a in command_parser(cmd, "cmd")._actions}
    assert helps["seed"] == "random seed of the sampling" and helps["device"].startswith("auto (CUDA")
    assert helps["out"] == "where the table goes"  # the docstring's own entry wins

    def undocumented(steps: int = 1) -> None:
        """A command without Args."""

    with pytest.raises(TypeError, match="'steps' has no entry"):
        command_parser(undocumented, "cmd")
