"""The bad-input fuzz table (tests/e2e/fuzz_cases.py): every case is refused with exit code 2 and one
``dspark-lightning <cmd>: error: ...`` line, without a traceback and without touching an existing file.

The cases run in-process in one shared workspace (a tiny exported drafter and its corrupted copies, made once per
session); ``scripts/fuzz_report.py`` runs the same table in subprocesses with a timeout for the before/after counts.
"""

import logging

import pytest

from .conftest import run_main
from .fuzz_cases import CASES, ERROR_LINE, argv_for, changed, make_workspace, snapshot


@pytest.fixture(scope="session")
def fuzz_workspace(tmp_path_factory):
    return make_workspace(tmp_path_factory.mktemp("fuzz") / "workspace")


def test_the_table_covers_every_command():
    assert len({c for c, _ in CASES}) == len(CASES)  # one id per case
    commands = {argv[0] for _, argv in CASES}
    wanted = {"fit", "decode", "eval", "bench", "calibrate", "threshold-sweep", "serve-bench", "profile", "export"}
    assert wanted | {"prepare"} <= commands


@pytest.mark.parametrize("argv", [argv for _, argv in CASES], ids=[case for case, _ in CASES])
def test_bad_input_is_refused_in_one_line(argv, fuzz_workspace, monkeypatch, capsys):
    monkeypatch.chdir(fuzz_workspace)
    monkeypatch.setenv("TQDM_DISABLE", "1")
    monkeypatch.setattr(logging, "raiseExceptions", False)  # handlers still bound to an earlier test's closed stderr
    before = snapshot(fuzz_workspace)
    code, _, err = run_main(argv_for(argv), capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err, err[-3000:]
    assert code == 2, err[-3000:]
    assert lines and ERROR_LINE.match(lines[-1]), err[-3000:]
    assert lines[-1].startswith(f"dspark-lightning {argv[0]}: error: ")
    assert not changed(before, snapshot(fuzz_workspace))


def test_help_lists_every_command(capsys):
    from dspark_lightning.cli.main import RECIPE_COMMANDS, commands

    code, out, _ = run_main(["--help"], capsys)
    listed = {line.split()[0] for line in out.splitlines() if line.startswith("    ") and line.split()}
    assert code == 0 and set(commands()) <= listed  # jsonargparse's list, each with its docstring's summary
    assert all(c in out for c in RECIPE_COMMANDS)  # the recipe commands, named in the description
