"""Bad inputs by class, each refused in one line before any work (or, for valid requests, served): loaders and
exporters that read damaged artifacts, weights that load but cannot decode, options checked where they are received,
valid requests that must not be refused, and messages that name the mistake. The train/serve pairing has its own
suite (test_train_serve_pairing.py)."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dspark_lightning import create, load_drafter, load_target
from dspark_lightning.checkpoint import DrafterLoadError, read_config, save_drafter, weights_sha256
from dspark_lightning.export import export_drafter
from dspark_lightning.infer import decode

from .conftest import TINY, run_main


@pytest.fixture(scope="module")
def target():
    return load_target("tiny-debug")


@pytest.fixture
def drafter_dir(tmp_path, target):
    torch.manual_seed(0)
    d = create(
        "drafter", "dspark", target, block_size=3, backbone={"class_path": "dense", "init_args": {"num_layers": 1}}
    )
    return save_drafter(d, tmp_path / "dspark", target)


def _rewrite(path: Path, edit) -> None:
    """Edit config.json and keep its config hash consistent (as a careful forger would)."""
    from dspark_lightning.checkpoint import config_sha256

    cfg = read_config(path)
    edit(cfg)
    cfg["config_sha256"] = config_sha256(cfg)
    (path / "config.json").write_text(json.dumps(cfg))


def _reweigh(path: Path, edit) -> None:
    state = load_file(str(path / "model.safetensors"))
    edit(state)
    save_file(state, str(path / "model.safetensors"))
    _rewrite(path, lambda cfg: cfg.update(weights_sha256=weights_sha256(state)))


# --- class 2: loaders and exporters never leak a library's exception -------------------------------------------------
DAMAGED = {
    "weights of the wrong shape": lambda p: _reweigh(p, lambda s: s.update({next(iter(s)): torch.zeros(3, 3)})),
    "block_size null": lambda p: _rewrite(p, lambda c: c.update(block_size=None)),
    "calibration file holding a list": lambda p: (p / "calibration_T1.json").write_text("[1, 2, 3]"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGED))
@pytest.mark.parametrize("entry", ["load_drafter", "export_drafter", "cli export"])
def test_a_damaged_drafter_is_refused_in_one_line_by_every_entry(drafter_dir, target, tmp_path, capsys, damage, entry):
    DAMAGED[damage](drafter_dir)
    if entry == "cli export":
        code, _, err = run_main(["export", "--drafter", str(drafter_dir), "--out", str(tmp_path / "out")], capsys)
        assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        return
    with pytest.raises(ValueError) as exc:  # DrafterLoadError and our own checks are ValueErrors
        if entry == "load_drafter":
            load_drafter(drafter_dir, target)
        else:
            export_drafter(drafter_dir, "dspark-hf", tmp_path / "out")
    assert "\n" not in str(exc.value) and str(drafter_dir) in str(exc.value) or "calibration" in str(exc.value)


def test_a_sharded_serving_folder_with_a_shard_that_is_not_safetensors(drafter_dir, tmp_path, capsys):
    out = tmp_path / "hf"
    export_drafter(drafter_dir, "dspark-hf", out)
    (out / "model.safetensors").write_bytes(b"\xff" * 64)  # a shard whose header is garbage
    with pytest.raises(DrafterLoadError, match="cannot"):
        export_drafter(out, "dspark-hf", tmp_path / "again", target=load_target("tiny-debug"))


# --- class 3: weights that load must decode -------------------------------------------------------------------------
def test_finite_weights_far_out_of_range_are_refused_at_load(drafter_dir, target):
    _reweigh(drafter_dir, lambda s: s.update({k: v * 1e30 for k, v in s.items() if v.is_floating_point()}))
    with pytest.raises(DrafterLoadError, match="overflow when decoding"):
        load_drafter(drafter_dir, target)


def test_a_reduced_vocabulary_export_loads_and_decodes(tmp_path, target):
    torch.manual_seed(0)
    d = create(
        "drafter",
        "dspark",
        target,
        block_size=3,
        backbone={"class_path": "dense", "init_args": {"num_layers": 1}},
        draft_vocab_size=64,
    )
    d.set_draft_vocab(torch.arange(64) * 3)  # the mask token (a target token) lies outside the draft vocabulary
    path = save_drafter(d, tmp_path / "reduced", target)
    res = decode(target, str(path), ["hello"], max_new_tokens=4, scheduler="static")
    assert len(res.token_ids[0]) == 4


# --- class 2/4: arguments refused where they are received ---------------------------------------------------------
@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda t: decode(None, None, ["hi"]), "target must be a loaded Target"),
        (lambda t: decode("tiny-debug", None, ["hi"], device="meta"), "not supported"),
        (lambda t: create("scheduler", "hardware_aware", context_len=-1), "context_len must be an integer >= 1"),
        (lambda t: load_target("tiny-debug", layer_ids=[[1, 2], 3]), "layer_ids must be a list of layer numbers"),
        (lambda t: create("backbone", "dense", t.geometry, sliding_window=-4), "sliding_window must be"),
    ],
)
def test_bad_arguments_are_refused_in_one_line(target, call, match):
    with pytest.raises(ValueError, match=match) as exc:
        call(target)
    assert "\n" not in str(exc.value)


def test_fastest_precision_refuses_an_unknown_device():
    from dspark_lightning.lightning.precision import FastestPrecision

    with pytest.raises(ValueError, match="unknown device|not supported"):
        FastestPrecision(device="tpu")


def test_option_sections_accept_dicts_and_name_unknown_keys():
    from dspark_lightning.lightning.config import OptimConfig, as_config

    assert as_config({"lr": 0.01}, OptimConfig, "model.optim").lr == 0.01
    with pytest.raises(ValueError, match=r"model.optim: unknown key\(s\) \['lrr'\]; the keys are"):
        as_config({"lrr": 0.01}, OptimConfig, "model.optim")
    with pytest.raises(TypeError, match="must be a OptimConfig or a dict"):
        as_config(3, OptimConfig, "model.optim")


def test_fused_optimizer_with_mixed_precision_and_clipping_is_refused_before_training(workdir):
    import lightning as L
    import yaml

    from dspark_lightning.lightning.datamodule import DSparkDataModule
    from dspark_lightning.lightning.module import DSparkModule

    recipe = yaml.safe_load(Path(TINY).read_text())
    data = {**recipe["data"], "target": recipe["target"]}
    module = DSparkModule(backbone="dense", block_size=4, optim={"fused": True})
    trainer = L.Trainer(accelerator="cpu", max_steps=2, precision="bf16-mixed", gradient_clip_val=1.0, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        default_root_dir=workdir / "run")  # fmt: skip
    with pytest.raises(ValueError, match="cannot run with trainer.precision bf16-mixed"):
        trainer.fit(module, DSparkDataModule(**data))
    assert module.global_step == 0


def test_eval_prompts_with_an_unknown_domain_is_refused(tmp_path):
    from dspark_lightning.eval.runner import responses_datasets

    f = tmp_path / "r.jsonl"
    f.write_text(json.dumps({"id": "x/1", "source": "x", "domain": "poetry", "turns": ["hi"]}) + "\n")
    with pytest.raises(ValueError, match="domain 'poetry' is not one of math, code, chat"):
        responses_datasets(f, 3)


# --- class 5: valid requests are served -----------------------------------------------------------------------------
def test_a_generator_of_prompts_is_decoded_like_a_list(target):
    want = decode(target, None, ["hi", "yo"], max_new_tokens=3).token_ids
    assert decode(target, None, (p for p in ["hi", "yo"]), max_new_tokens=3).token_ids == want


# --- class 6: messages that name the mistake ------------------------------------------------------------------------
def test_a_typo_inside_init_args_names_the_key_and_the_keys_that_exist(tmp_path, capsys):
    recipe = tmp_path / "typo.yaml"
    recipe.write_text(Path(TINY).read_text().replace("init_args: {num_layers: 1}", "init_args: {num_layerz: 1}"))
    assert "num_layerz" in recipe.read_text()
    code, _, err = run_main(["fit", "--config", str(recipe)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "has no parameter 'num_layerz'; it takes" in err and "num_layers" in err
    shutil.rmtree(tmp_path / "outputs", ignore_errors=True)


def test_decode_loads_the_target_with_the_layers_the_drafter_was_trained_on(tmp_path, capsys):
    """A drafter trained on other taps than the target's default is served by ``--target NAME --drafter DIR``."""
    t = load_target("tiny-debug", layer_ids=[1, 3, 5])
    torch.manual_seed(0)
    d = create("drafter", "dspark", t, block_size=3, backbone={"class_path": "dense", "init_args": {"num_layers": 1}})
    path = save_drafter(d, tmp_path / "taps135", t)
    args = ["decode", "--target", "tiny-debug", "--drafter", str(path), "--prompt", "hi", "--max_new_tokens", "3",
            "--scheduler", "static"]  # fmt: skip
    code, _, err = run_main(args, capsys)
    assert code == 0, err[-1500:]


# --- held-out robustness findings: file names that are not UTF-8, a config without its hash, stale shards ---------
def test_paths_that_are_not_utf8_are_file_names_and_text_that_is_not_is_refused(drafter_dir, tmp_path, capsys,
                                                                               monkeypatch):  # fmt: skip
    """POSIX paths are bytes: ``--json_out $'out\\xff.json'`` and a drafter folder ``dr\\xff`` work (os.fsdecode
    round-trips them); a prompt that is not UTF-8 is still refused in one line."""
    import os

    monkeypatch.chdir(tmp_path)
    odd = os.fsdecode(b"dr\xff")
    shutil.copytree(drafter_dir, tmp_path / odd)
    out = os.fsdecode(b"out\xff.json")
    code, _, err = run_main(["decode", "--target", "tiny-debug", "--drafter", odd, "--prompt", "hi",
                             "--max_new_tokens", "4", f"--json_out={out}"], capsys)  # fmt: skip
    assert code == 0, err
    assert b"out\xff.json" in os.listdir(b".") and json.loads((tmp_path / out).read_text())
    code, _, err = run_main(["decode", "--target", "tiny-debug", "--prompt", os.fsdecode(b"h\xffi")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "not valid UTF-8" in err


def test_a_config_without_its_hash_is_checked_against_the_weights(drafter_dir, target):
    """The weights file records the config's hash and the fields its shapes cannot tell: with ``config_sha256``
    dropped, the unedited config loads as it is and decodes; an edited field (block size, mask token, taps) is
    refused, naming the field and both values; weights without that record load with a one-line note."""

    cfg = read_config(drafter_dir)
    del cfg["config_sha256"]
    (drafter_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.warns(UserWarning, match="it is the config its weights were exported with"):
        d = load_drafter(drafter_dir, target)
    assert d.block_size == 3 and len(decode(target, d, ["hi"], max_new_tokens=4).token_ids[0]) == 4
    layers = {**cfg["geometry"], "layer_ids": [0, 2]}
    edits = {"block_size": {**cfg, "block_size": 5}, "mask_token_id": {**cfg, "mask_token_id": 2},
             "layer_ids": {**cfg, "geometry": layers}}  # fmt: skip
    for key, edited in edits.items():
        (drafter_dir / "config.json").write_text(json.dumps(edited))
        with pytest.raises(DrafterLoadError, match=rf"no config_sha256 and says {key} = .*exported with {key} ="):
            load_drafter(drafter_dir, target)
    save_file(load_file(str(drafter_dir / "model.safetensors")), str(drafter_dir / "model.safetensors"))  # no record
    (drafter_dir / "config.json").write_text(json.dumps({**cfg, "block_size": 5}))
    with pytest.warns(UserWarning, match="no config_sha256: its fields are not integrity-checked"):
        assert load_drafter(drafter_dir, target).block_size == 5


def _shard(out: Path, stale: bool) -> dict:
    """Split a serving folder's weights into two shards plus an index; ``stale``: a modified copy of one tensor
    is also left in the shard the index does not name for it."""
    state = load_file(str(out / "model.safetensors"))
    (out / "model.safetensors").unlink()
    names = sorted(state)
    first, second = names[: len(names) // 2], names[len(names) // 2 :]
    shard_a = {k: state[k] for k in first}
    if stale:
        shard_a[second[0]] = state[second[0]] + 1.0
    save_file(shard_a, str(out / "model-00001-of-00002.safetensors"))
    save_file({k: state[k] for k in second}, str(out / "model-00002-of-00002.safetensors"))
    weight_map = {k: "model-00001-of-00002.safetensors" for k in first}
    weight_map |= {k: "model-00002-of-00002.safetensors" for k in second}
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return state


def test_a_sharded_folder_loads_each_tensor_from_the_shard_its_index_names(drafter_dir, target, tmp_path):
    from dspark_lightning.export.dspark_hf import read_weights

    out = tmp_path / "hf"
    export_drafter(drafter_dir, "dspark-hf", out)
    state = _shard(out, stale=False)
    got, _ = read_weights(out)
    assert got.keys() == state.keys() and all(torch.equal(got[k], state[k]) for k in state)
    assert load_drafter(out, target) is not None

    stale = tmp_path / "stale"
    export_drafter(drafter_dir, "dspark-hf", stale)
    _shard(stale, stale=True)
    with pytest.raises(DrafterLoadError, match="stored in two shards"):
        load_drafter(stale, target)
