"""Renamed words keep working for a while, each with a notice (dspark_lightning/renames.py, cli/signature.py): the
runtime's ``layout=`` is ``batching=``, ``export --format`` is ``--layout``, ``bench --layouts`` is ``--batching``,
and a plugin factory that still takes ``layout=`` is called with it."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest

from dspark_lightning import registry
from dspark_lightning.cli.main import main
from dspark_lightning.cli.signature import command_parser, current_argv, renamed, run
from dspark_lightning.export.convert import ExportResult
from dspark_lightning.infer.acceptance.sampling import SamplingParams
from dspark_lightning.infer.build import make_engine
from dspark_lightning.infer.propose.draft import make_proposer
from dspark_lightning.registry import register
from dspark_lightning.renames import keyword_for, renamed_keyword


@renamed(layout="batching", layouts="batching")
def toy(batching: str = "padded", steps: int = 1) -> dict:
    """A toy command.

    Args:
        batching: padded | flat
        steps: how many steps
    """
    return dict(locals())


def test_a_former_flag_is_rewritten_with_a_notice(capsys):
    assert run(toy, ["--layout", "flat", "--steps", "2"], "toy") == {"batching": "flat", "steps": 2}
    assert "toy: note: --layout is now --batching" in capsys.readouterr().err
    assert run(toy, ["--layouts=flat"], "toy") == {"batching": "flat", "steps": 1}
    assert "--layouts is now --batching" in capsys.readouterr().err
    assert run(toy, ["--batching", "flat"], "toy")["batching"] == "flat"
    assert capsys.readouterr().err == ""  # the current name says nothing
    assert current_argv(toy, ["--steps", "--layout"], "toy") == ["--steps", "--batching"]
    assert "(formerly --layout" in command_parser(toy, "toy").format_help()


@pytest.mark.parametrize(
    ("argv", "note"),
    [(["bench", "--drafter", "d", "--layouts", "ragged", "--out", "o"], "--layouts is now --batching"),
     (["decode", "--layout", "ragged", "--prompt", "x"], "--layout is now --batching"),
     (["serve-bench", "--layout", "ragged", "--out", "o"], "--layout is now --batching"),
     (["export", "--drafter", "d", "--format", "nope", "--out", "o"], "--format is now --layout")],
)  # fmt: skip
def test_the_commands_take_their_former_flags(argv, note, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2  # refused (no drafter d, or a bad value) after the flag was read under its new name
    err = capsys.readouterr().err.splitlines()
    assert note in err[0] and "error:" in err[-1]
    if argv[0] == "decode":  # checked before any file: the error names the current flag
        assert "--batching" in err[-1]


def test_export_format_is_the_layout_flag(tmp_path, capsys):
    from dspark_lightning.cli.export import export

    argv = current_argv(export, ["--drafter", "d", "--out", "o", "--format", "eagle3-hf"], "export")
    cfg = command_parser(export, "export").parse_args(argv)
    assert cfg.layout == "eagle3-hf"
    assert "--format is now --layout" in capsys.readouterr().err


def test_a_former_keyword_warns_and_both_are_refused():
    with pytest.warns(DeprecationWarning, match="layout= is now batching="):
        assert renamed_keyword("f()", "layout", "batching", "flat", "padded", "padded") == "flat"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert renamed_keyword("f()", "layout", "batching", None, "flat", "padded") == "flat"
    with pytest.raises(ValueError, match="give batching= only"):
        renamed_keyword("f()", "layout", "batching", "flat", "flat", "padded")


def test_make_engine_takes_layout_as_batching(tiny_target):
    with pytest.warns(DeprecationWarning, match="make_engine\\(\\): layout= is now batching="):
        engine = make_engine(tiny_target, None, SamplingParams(0.0), layout="flat", verifier="hf")
    assert engine.verifier.batching == "flat"


def test_export_result_format_is_its_layout(tmp_path):
    res = ExportResult(tmp_path, "dspark-hf", "bf16", 3)
    with pytest.warns(DeprecationWarning, match="ExportResult.layout"):
        assert res.format == "dspark-hf" == res.layout


def test_a_plugin_factory_with_the_former_keyword_is_called_with_it():
    def old(drafter, layout="padded", conf_temperatures=None):
        return SimpleNamespace(layout=layout)

    def new(drafter, batching="padded", conf_temperatures=None):
        return SimpleNamespace(batching=batching)

    def any_keywords(drafter, **kw):
        return kw

    with pytest.warns(DeprecationWarning, match="takes layout=, now named batching="):
        assert keyword_for(old, "batching", "layout", "flat") == {"layout": "flat"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert keyword_for(new, "batching", "layout", "flat") == {"batching": "flat"}
        assert keyword_for(any_keywords, "batching", "layout", "flat") == {"batching": "flat"}

    class Old:
        proposer_name = "_test_old_proposer"

    register("proposer", "_test_old_proposer")(old)
    try:
        with pytest.warns(DeprecationWarning):
            assert make_proposer(Old(), batching="flat").layout == "flat"
    finally:
        registry._REGISTRY["proposer"].pop("_test_old_proposer")


def test_prepare_verify_is_check_cache(capsys):
    """``prepare --verify`` hashed every shard; "verify" now means only the target's forward over drafts."""
    from dspark_lightning.cli.prepare import parse_recipe, prepare

    _, kwargs = parse_recipe("prepare", ["--config", "recipes/tiny_debug.yaml", "--verify"], prepare)
    assert kwargs["check_cache"] is True
    assert "dspark-lightning prepare: note: --verify is now --check_cache" in capsys.readouterr().err


def test_engine_make_proposer_and_build_verifier_take_layout_as_batching(tiny_target):
    from dspark_lightning.infer import Engine, build_verifier

    with pytest.warns(DeprecationWarning, match="Engine\\(\\): layout= is now batching="):
        engine = Engine(tiny_target, None, params=SamplingParams(0.0), stop_token_ids=[], layout="flat", verifier="hf")
    assert engine.verifier.batching == "flat"
    with pytest.warns(DeprecationWarning, match="build_verifier\\(\\): layout="):
        assert build_verifier("hf", tiny_target, layout="flat").batching == "flat"

    class Toy:
        proposer_name = "_test_toy_new"

    register("proposer", "_test_toy_new")(lambda drafter, batching="padded", conf_temperatures=None: batching)
    try:
        with pytest.warns(DeprecationWarning, match="make_proposer\\(\\): layout="):
            assert make_proposer(Toy(), layout="flat") == "flat"
    finally:
        registry._REGISTRY["proposer"].pop("_test_toy_new")
