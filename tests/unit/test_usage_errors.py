"""Errors that help: what the user can fix is one ``UsageError`` line naming the field; a bug keeps its traceback.

The five messy answers a fuzz run found (a string block size, a serving config field of the wrong type, a calibration
side file holding a list, a callable scheduler of the wrong shape, a recipe's ``rank: 16x``) are each one clear line;
a ``TypeError`` raised by our own code inside a loader is not rewritten; the console script prints a usage error in
one line (with its traceback and cause under ``DSPARK_TRACEBACK=1``) and any other exception with its traceback.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dspark_lightning import create
from dspark_lightning.checkpoint import DrafterLoadError, artifact_entry, load_drafter, save_drafter
from dspark_lightning.checkpoint.calibration import read_calibration_doc, sts_temperatures_of
from dspark_lightning.checks import UsageError

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "recipes" / "tiny_debug.yaml"


def one_line(exc: BaseException) -> str:
    msg = str(exc)
    assert msg and "\n" not in msg, msg
    return msg


def small(target, **kw):
    torch.manual_seed(0)
    kw.setdefault("backbone", {"class_path": "dense", "init_args": {"num_layers": 1}})
    return create("drafter", "dspark", target, block_size=3, mask_token_id=1, **kw)


# --- 1. create("drafter", ..., block_size="4") ------------------------------------------------------------------
def test_a_string_block_size_is_named_not_a_raw_type_error(tiny_target):
    with pytest.raises(UsageError) as e:
        create("drafter", "dspark", tiny_target, block_size="4")
    msg = one_line(e.value)
    assert "block_size" in msg and "'4'" in msg


def test_a_part_argument_of_the_wrong_type_or_name_is_named(tiny_target):
    with pytest.raises(UsageError, match=r"backbone 'dense': num_layers must be an int, got 'two'"):
        small(tiny_target, backbone={"class_path": "dense", "init_args": {"num_layers": "two"}})
    with pytest.raises(UsageError, match=r"takes no argument 'blok_size'.*block_size"):
        create("drafter", "dspark", tiny_target, blok_size=4)
    with pytest.raises(UsageError, match="block_size"):  # the class itself, built without the registry
        from dspark_lightning.drafters import Drafter

        d = small(tiny_target)
        Drafter(d.backbone, geometry=d.geometry, embed=d.embed, lm_head=d.lm_head, block_size=2.5, mask_token_id=1)


# --- 2. a serving config with block_size: null or a nested target_layer_ids ---------------------------------------
@pytest.fixture
def serving_dir(varied_target, tmp_path):
    from dspark_lightning.export import export_drafter

    save_drafter(
        small(varied_target, seq_head={"class_path": "vanilla", "init_args": {"rank": 8}}),
        tmp_path / "native",
        varied_target,
    )
    export_drafter(tmp_path / "native", "dspark-hf", tmp_path / "hf", target=varied_target)
    return tmp_path / "hf"


@pytest.mark.parametrize(
    "key, value", [("block_size", None), ("target_layer_ids", [[1, 2], [3]]), ("mask_token_id", "1"),
                   ("num_hidden_layers", 1.5)]
)  # fmt: skip
def test_a_serving_config_field_of_the_wrong_type_is_named(varied_target, serving_dir, key, value):
    from dspark_lightning.checkpoint import recorded_target_args

    f = serving_dir / "config.json"
    f.write_text(json.dumps({**json.loads(f.read_text()), key: value}))
    with pytest.raises(DrafterLoadError) as e:
        load_drafter(serving_dir, varied_target)
    msg = one_line(e.value)
    assert str(f) in msg and key in msg and "TypeError" not in msg and "int() argument" not in msg
    if key == "target_layer_ids":  # what --target NAME --drafter DIR reads first
        with pytest.raises(DrafterLoadError, match="target_layer_ids must be a list of integers"):
            recorded_target_args(serving_dir)


def test_a_native_config_field_of_the_wrong_type_is_named(tiny_target, tmp_path):
    path = save_drafter(small(tiny_target), tmp_path / "d", tiny_target)
    f = path / "config.json"
    cfg = json.loads(f.read_text())
    cfg.pop("config_sha256")  # an edited config without its hash is read field by field
    cfg["geometry"]["layer_ids"] = [[1], [2]]
    f.write_text(json.dumps(cfg))
    with pytest.raises(DrafterLoadError, match=r"config.json: geometry\.layer_ids must be a list of integers"):
        load_drafter(path, tiny_target)


# --- 3. a calibration file holding a JSON list --------------------------------------------------------------------
def test_a_calibration_file_holding_a_list_is_one_line_naming_it(tiny_target, tmp_path):
    path = save_drafter(small(tiny_target), tmp_path / "d", tiny_target)
    (path / "calibration_T1.json").write_text("[1, 2]\n")
    with pytest.raises(UsageError) as e:
        load_drafter(path, tiny_target)
    msg = one_line(e.value)
    assert "calibration_T1.json" in msg and "list" in msg and "AttributeError" not in msg


def test_the_side_file_reader_refuses_a_list_and_checks_its_table(tmp_path):
    f = tmp_path / "dspark_calibration.json"
    f.write_text("[1, 2]")
    with pytest.raises(UsageError, match=r"dspark_calibration.json is not a JSON object \(it holds a list\)"):
        read_calibration_doc(f)
    with pytest.raises(UsageError, match="sts_temperatures must be an object"):
        sts_temperatures_of({"sts_temperatures": [1.0]}, f)
    with pytest.raises(UsageError, match=r"sts_temperatures\['1'\]: temperatures must be"):
        sts_temperatures_of({"sts_temperatures": {"1": "hot"}}, f)
    assert sts_temperatures_of({"sts_temperatures": {"1": [0.5, 2]}}, f) == {1.0: [0.5, 2.0]}


def test_a_serving_side_file_holding_a_list_is_one_line_naming_it(varied_target, serving_dir):
    (serving_dir / "dspark_calibration.json").write_text("[1, 2]\n")
    with pytest.raises(UsageError) as e:
        load_drafter(serving_dir, varied_target)
    assert "dspark_calibration.json" in one_line(e.value) and "list" in str(e.value)


# --- 4. a callable scheduler returning the wrong shape ------------------------------------------------------------
def two_columns(conf):
    return torch.ones(conf.shape[0], 2, dtype=torch.long)


def three_lengths(conf):
    return [1, 1, 1]


@pytest.mark.parametrize("scheduler, got", [(two_columns, "shape (2, 2)"), (three_lengths, "shape (3,)")])
def test_a_callable_scheduler_of_the_wrong_shape_is_named_where_the_engine_receives_it(varied_target, scheduler, got):
    from dspark_lightning.infer import decode

    with pytest.raises(UsageError) as e:
        decode(varied_target, small(varied_target), [[5, 17, 33], [9, 4]], max_new_tokens=4, scheduler=scheduler)
    msg = one_line(e.value)
    assert scheduler.__name__ in msg and got in msg and "shape (2,)" in msg and "zip()" not in msg


# --- 5. rank: 16x in a recipe -------------------------------------------------------------------------------------
def test_a_recipe_value_of_the_wrong_type_names_the_key_not_the_union(tmp_path, monkeypatch, capsys):
    from dspark_lightning.cli import main

    recipe = tmp_path / "r.yaml"
    recipe.write_text(TINY.read_text().replace("init_args: {rank: 16}", "init_args: {rank: 16x}"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["fit", "--config", str(recipe)])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert e.value.code == 2 and len(lines) == 1, lines
    assert lines[0] == "dspark-lightning fit: error: --model.seq_head.rank: expected an int, got '16x'"


def test_a_recipe_value_no_member_of_a_union_takes_is_one_line_naming_the_members(tmp_path, monkeypatch, capsys):
    from dspark_lightning.cli import main

    recipe = tmp_path / "r.yaml"
    recipe.write_text(TINY.read_text().replace("trainer:\n", "trainer:\n  max_time: {minutes: 5.5}\n", 1))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["fit", "--config", str(recipe)])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert e.value.code == 2 and len(lines) == 1, lines
    want = "--trainer.max_time: expected str | timedelta | dict[str, int] | null, got {'minutes': 5.5}"
    assert lines[0] == f"dspark-lightning fit: error: {want}"


# --- a bug inside a loader keeps its type -------------------------------------------------------------------------
def test_an_internal_type_error_inside_a_loader_is_not_rewritten(tiny_target, tmp_path, monkeypatch):
    from dspark_lightning.checkpoint import native

    path = save_drafter(small(tiny_target), tmp_path / "d", tiny_target)

    def bug(*args, **kwargs):
        raise TypeError("a bug in our own code")

    monkeypatch.setattr(native, "check_compatible", bug)
    with pytest.raises(TypeError, match="a bug in our own code") as e:
        load_drafter(path, tiny_target)
    assert not isinstance(e.value, UsageError)


def test_a_library_error_on_the_files_becomes_a_load_error_with_its_cause(tmp_path):
    @artifact_entry("drafter")
    def reads(path):
        return json.loads("{not json")

    @artifact_entry("drafter")
    def buggy(path):
        return None.get("x")

    with pytest.raises(DrafterLoadError) as e:
        reads(tmp_path)
    assert str(tmp_path) in one_line(e.value) and isinstance(e.value.__cause__, json.JSONDecodeError)
    with pytest.raises(AttributeError):
        buggy(tmp_path)


# --- the console script -------------------------------------------------------------------------------------------
def console(body: str, **env: str) -> subprocess.CompletedProcess:
    """``dspark-lightning decode`` in a subprocess whose command is replaced by ``boom`` (defined in ``body``)."""
    code = "\n".join(["import sys", "import dspark_lightning.cli", "from dspark_lightning.checks import UsageError",
                      "m = sys.modules['dspark_lightning.cli.main']", body, "m._dispatch = boom",
                      "m.main(['decode'])"])  # fmt: skip
    environ = {k: v for k, v in os.environ.items() if k != "DSPARK_TRACEBACK"} | {"HF_HUB_OFFLINE": "1"} | env
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ, timeout=300)


def test_the_console_script_shows_a_bugs_traceback():
    r = console("def boom(*args):\n    raise TypeError('a bug in our own code')")
    assert r.returncode == 1 and "Traceback (most recent call last)" in r.stderr
    assert r.stderr.rstrip().endswith("TypeError: a bug in our own code") and "error:" not in r.stderr


def test_the_console_script_prints_a_usage_error_in_one_line():
    r = console("def boom(*args):\n    raise UsageError('--x must be 1, got 2')")
    assert r.returncode == 2 and r.stderr.splitlines() == ["dspark-lightning decode: error: --x must be 1, got 2"]


def test_dspark_traceback_adds_the_traceback_and_its_cause_to_a_usage_error():
    body = ("def boom(*args):\n    try:\n        int('x')\n    except ValueError as exc:\n"
            "        raise UsageError('--x must be an int') from exc")  # fmt: skip
    r = console(body, DSPARK_TRACEBACK="1")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and lines[-1] == "dspark-lightning decode: error: --x must be an int"
    assert "invalid literal for int()" in r.stderr and "direct cause of the following exception" in r.stderr


def test_the_installed_script_refuses_bad_input_in_one_line():
    script = Path(sys.executable).parent / "dspark-lightning"
    if not script.exists():
        pytest.skip("the console script is not installed beside this interpreter")
    r = subprocess.run([str(script), "llamacpp", "nope"], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "HF_HUB_OFFLINE": "1"})  # fmt: skip
    want = "dspark-lightning llamacpp: error: argument subcommand: invalid choice: 'nope' (choose from 'source', "
    want += "'build')"
    assert r.returncode == 2 and r.stderr.splitlines() == [want]


def test_one_line_error_names_the_nested_key_of_jsonargparse_s_union_dump():
    from dspark_lightning.errors import one_line_error

    raw = (  # what jsonargparse 4 raises for `seq_head: {class_path: ...VanillaMarkovHead, init_args: {rank: 16x}}`
        'Parser key "model.seq_head":\n  Does not validate against any of the Union subtypes\n  Subtypes: '
        "[collections.abc.Callable[[dspark_lightning.targets.target.TargetGeometry], torch.nn.modules.module.Module], "
        "<class 'str'>, <class 'NoneType'>]\n  Errors:\n    - Type collections.abc.Callable[[dspark_lightning.targets."
        "target.TargetGeometry], torch.nn.modules.module.Module] expects a function or a callable class: Parser key "
        "\"rank\":\n        Expected a <class 'int'>. Got value: 16x. Got value: Namespace(class_path='dspark_lightning"
        ".drafters.VanillaMarkovHead', init_args=Namespace(rank='16x'))\n    - Expected a <class 'str'>\n    - "
        "Expected a <class 'NoneType'>\n  Given value type: <class 'dict'>\n  Given value: "
        "{'class_path': 'dspark_lightning.drafters.VanillaMarkovHead', 'init_args': {'rank': '16x'}}"
    )
    assert one_line_error(ValueError(raw)) == "--model.seq_head.rank: expected an int, got '16x'"
    assert one_line_error(ValueError("Parser key \"steps\":\n  Expected a <class 'int'>. Got value: x")) == (
        "--steps: expected an int, got 'x'"
    )
