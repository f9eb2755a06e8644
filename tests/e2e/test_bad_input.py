"""Bad input: a one-line error at start-up, exit code 2, nothing overwritten."""

import re
from pathlib import Path

import pytest

from .conftest import TINY, run_main


def _one_line_error(err: str) -> str:
    lines = [ln for ln in err.splitlines() if re.match(r"dspark-lightning( [a-z-]+)?: error:", ln)]
    assert len(lines) == 1, err[-2000:]
    return lines[0]


def test_unknown_component_class(workdir, capsys):
    code, _, err = run_main(
        ["fit", "--config", TINY, "--model.seq_head.class_path=dspark_lightning.drafters.NoSuchHead"], capsys
    )
    assert code == 2 and "NoSuchHead" in _one_line_error(err)


def test_unknown_prompt_source_lists_available(workdir, capsys):
    code, _, err = run_main(["fit", "--config", TINY, "--data.sources=[nope]"], capsys)
    line = _one_line_error(err)
    assert code == 2 and "nope" in line and "humaneval" in line


def test_unknown_recipe_key(workdir, capsys):
    bad = workdir / "bad.yaml"
    bad.write_text(open(TINY).read() + "\nmodel_typo: 3\n")
    code, _, err = run_main(["fit", "--config", str(bad)], capsys)
    assert code == 2 and "model_typo" in _one_line_error(err)


def test_missing_target_path(workdir, capsys):
    code, _, err = run_main(["fit", "--config", TINY, "--target.name=/nonexistent/model"], capsys)
    assert code == 2 and "/nonexistent/model" in _one_line_error(err)


def test_existing_export_dir_is_not_overwritten(workdir, capsys):
    out = workdir / "mine"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    code, _, err = run_main(["fit", "--config", TINY, f"--export.dir={out}"], capsys)
    assert code == 2 and "refusing to overwrite" in _one_line_error(err)
    assert (out / "keep.txt").read_text() == "precious"


def test_corrupt_cache_shard_is_named_and_left_alone(workdir, capsys):
    args = ["fit", "--config", TINY, "--data.features=cached", "--trainer.max_steps=1", "--validate_before_fit=false"]
    code, _, err = run_main(args, capsys)
    assert code == 0, err[-2000:]
    shard = sorted((workdir / "outputs/tiny_debug/data/features_train").glob("shard-*.tar"))[0]
    shard.write_bytes(shard.read_bytes()[:-700])  # truncated
    before = shard.read_bytes()
    code, _, err = run_main(args, capsys)
    assert code == 2 and shard.name in _one_line_error(err)
    assert shard.read_bytes() == before


def test_drafter_for_a_different_target_is_refused(workdir, tmp_path):
    from dspark_lightning import create, load_drafter, load_target
    from dspark_lightning.checkpoint import DrafterLoadError, save_drafter
    from dspark_lightning.targets.embedded import build_tiny_target

    tiny = load_target("tiny-debug")
    path = save_drafter(
        create(
            "drafter", "dspark", tiny, block_size=2, backbone={"class_path": "dense", "init_args": {"num_layers": 1}}
        ),
        tmp_path / "d",
        tiny,
    )
    build_tiny_target(tmp_path / "other", hidden_size=32)
    other = load_target(str(tmp_path / "other"), layer_ids=list(tiny.geometry.layer_ids))
    with pytest.raises(DrafterLoadError, match="hidden_size=64 does not match") as e:
        load_drafter(path, target=other)
    assert "\n" not in str(e.value)


def test_a_recipe_without_a_target_is_refused(tmp_path, capsys, monkeypatch):
    """target.name has no default: a recipe that forgets it must not train against some built-in target."""
    import yaml

    cfg = yaml.safe_load(Path(TINY).read_text())
    del cfg["target"]["name"]
    recipe = tmp_path / "no_target.yaml"
    recipe.write_text(yaml.safe_dump(cfg))
    monkeypatch.chdir(tmp_path)
    code, _, err = run_main(["fit", "--config", str(recipe), "--trainer.max_steps=1"], capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and "target.name" in lines[-1] and lines[-1].startswith("dspark-lightning")
    assert not (tmp_path / "outputs").exists()
