"""No silent divergence or tampering: invalid hyperparameters, non-finite weights and temperatures, an
edited export config.json and a killed export are refused or cleaned up with one-line errors."""

import json
import math
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file, save_file

from dspark_lightning.calibration import fit_sts, save_calibration
from dspark_lightning.checkpoint import (
    DrafterLoadError,
    config_sha256,
    load_drafter,
    read_config,
    save_drafter,
    weights_sha256,
)
from dspark_lightning.checkpoint.calibration import load_calibrations
from dspark_lightning.lightning.config import LossConfig, OptimConfig, check_hparams
from dspark_lightning.losses import position_weights
from dspark_lightning.registry import create

BAD_HPARAMS = [
    ("optim", "lr", math.inf, "model.optim.lr"),
    ("optim", "lr", 0.0, "model.optim.lr"),
    ("optim", "lr", -1e-3, "model.optim.lr"),
    ("optim", "lr", math.nan, "model.optim.lr"),
    ("optim", "eps", 0.0, "model.optim.eps"),
    ("optim", "betas", (0.9, 1.0), "model.optim.betas"),
    ("optim", "weight_decay", math.nan, "model.optim.weight_decay"),
    ("optim", "warmup_fraction", 1.5, "model.optim.warmup_fraction"),
    ("loss", "l1_weight", math.nan, "model.loss.l1_weight"),
    ("loss", "ce_weight", -0.1, "model.loss.ce_weight"),
    ("loss", "conf_weight", math.inf, "model.loss.conf_weight"),
    ("loss", "decay", 0.0, "model.loss.decay"),
    ("loss", "decay", -4.0, "model.loss.decay"),
    ("loss", "decay", math.inf, "model.loss.decay"),
    ("loss", "chunk_size", 0, "model.loss.chunk_size"),
]


@pytest.mark.parametrize(("part", "key", "value", "name"), BAD_HPARAMS)
def test_invalid_hyperparameters_are_refused_naming_the_key(part, key, value, name):
    loss, optim = LossConfig(), OptimConfig()
    loss, optim = (replace(loss, **{key: value}), optim) if part == "loss" else (loss, replace(optim, **{key: value}))
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        check_hparams(loss, optim, block_size=4)


def test_valid_hyperparameters_pass():
    check_hparams(LossConfig(decay=None, ce_weight=0.0), OptimConfig(lr=1e-4, warmup_fraction=0.0), block_size=1)
    with pytest.raises(ValueError, match="all-zero loss"):
        check_hparams(LossConfig(ce_weight=0, l1_weight=0, conf_weight=0), OptimConfig(), block_size=4)


def test_decay_zero_is_refused_at_the_root():
    """w_1 = exp(-0/0) was NaN, and with it every loss: decay must be > 0 (null = uniform)."""
    with pytest.raises(ValueError, match="decay must be finite and > 0"):
        position_weights(4, 0.0)
    assert torch.isfinite(position_weights(4, 1e-3)).all()


@pytest.fixture
def drafter(tiny_target):
    torch.manual_seed(0)
    d = create("drafter", "dspark", tiny_target, block_size=3, mask_token_id=1, backbone={"class_path": "dense"})
    return d.eval()


def test_export_and_load_refuse_non_finite_weights(drafter, tiny_target, tmp_path):
    state = {k: v.clone() for k, v in drafter.state_dict().items()}
    name = next(k for k, v in state.items() if v.is_floating_point())
    state[name][0] = float("nan")
    with pytest.raises(ValueError, match=rf"refusing to export .*{name}.*non-finite"):
        save_drafter(drafter, tmp_path / "nan", tiny_target, state=state)
    assert not (tmp_path / "nan").exists()
    # an export written by an older version (finite check absent, hashes consistent) is refused on load
    out = save_drafter(drafter, tmp_path / "d", tiny_target)
    save_file(state, str(out / "model.safetensors"))
    cfg = read_config(out)
    cfg["weights_sha256"] = weights_sha256(state)
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DrafterLoadError, match=rf"model.safetensors: tensor '{name}' has non-finite values"):
        load_drafter(out, tiny_target)


@pytest.mark.parametrize(
    ("key", "value"), [("block_size", 2), ("mask_token_id", 2), ("convention", "unshifted"), ("seq_head", None)]
)
def test_edited_config_is_refused(drafter, tiny_target, tmp_path, key, value):
    out = save_drafter(drafter, tmp_path / "d", tiny_target)
    cfg = read_config(out)
    assert cfg["config_sha256"] == config_sha256(cfg)
    cfg[key] = value
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    with pytest.raises(DrafterLoadError, match="edited after export"):
        load_drafter(out, tiny_target)


def test_export_without_config_hash_loads_with_a_warning(drafter, tiny_target, tmp_path):
    out = save_drafter(drafter, tmp_path / "d", tiny_target)
    cfg = read_config(out)
    del cfg["config_sha256"]
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.warns(UserWarning, match="no config_sha256"):
        assert load_drafter(out, tiny_target).config() == drafter.config()


def test_truncated_export_files_give_one_line_errors(drafter, tiny_target, tmp_path):
    out = save_drafter(drafter, tmp_path / "d", tiny_target)
    weights = (out / "model.safetensors").read_bytes()
    (out / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    with pytest.raises(DrafterLoadError, match="model.safetensors is not a readable safetensors file"):
        load_drafter(out, tiny_target)
    text = (out / "config.json").read_text()
    (out / "config.json").write_text(text[: len(text) // 2])
    with pytest.raises(DrafterLoadError, match="config.json is not readable JSON"):
        load_drafter(out, tiny_target)


def test_killed_export_leaves_nothing_that_blocks_or_loads(drafter, tiny_target, tmp_path):
    orphan = tmp_path / ".d.export-tmp-killed"  # what a kill between the two writes and the rename leaves
    orphan.mkdir()
    (orphan / "model.safetensors").write_bytes(b"\x00" * 10)
    with pytest.raises(FileNotFoundError):
        load_drafter(orphan, tiny_target)
    assert not (tmp_path / "d").exists()  # the final name appears only complete
    with pytest.warns(UserWarning, match="interrupted"):
        out = save_drafter(drafter, tmp_path / "d", tiny_target)
    assert not orphan.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["d"]
    load_drafter(out, tiny_target)
    save_drafter(drafter, out, tiny_target, overwrite=True)  # overwrite replaces the files in place
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]


def test_sts_refuses_non_finite_logits_and_temperatures(drafter, tiny_target, tmp_path):
    g = torch.Generator().manual_seed(0)
    z, m, ell = torch.randn(400, 3, generator=g), torch.randint(0, 4, (400,), generator=g), torch.full((400,), 3)
    z[5, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN or inf"):
        fit_sts(z, m, ell)
    with pytest.raises(ValueError, match="STS grid"):
        fit_sts(z.nan_to_num(), m, ell, grid=torch.tensor([0.5, 0.0, 2.0]))
    res = fit_sts(z.nan_to_num(), m, ell, min_rows=10)
    out = save_drafter(drafter, tmp_path / "d", tiny_target)
    sha = read_config(out)["weights_sha256"]
    with pytest.raises(ValueError, match="refusing to write"):
        save_calibration(out, replace(res, temperatures=[1.0, math.nan, 1.0]), temperature=1.0, dataset={},
                         weights_sha256=sha)  # fmt: skip
    path = save_calibration(out, res, temperature=1.0, dataset={}, weights_sha256=sha)
    assert load_calibrations(out, sha) == {1.0: res.temperatures}
    doc = json.loads(path.read_text())
    for temps in ([1.0, float("nan"), 1.0], [1.0, -1.0, 1.0], [], "1.0"):
        path.write_text(json.dumps({**doc, "temperatures": temps}))  # json writes NaN, and reads it back
        with pytest.raises(ValueError, match=rf"calibration file .*{path.name}: temperatures must be"):
            load_drafter(out, tiny_target)
    path.write_text(json.dumps({**doc, "sampling_temperature": float("inf")}))
    with pytest.raises(ValueError, match="sampling_temperature"):
        load_calibrations(out, sha)


def test_loaded_weights_are_the_saved_ones(drafter, tiny_target, tmp_path):
    out = save_drafter(drafter, tmp_path / "d", tiny_target)
    saved = load_file(str(out / "model.safetensors"))
    assert all(torch.equal(saved[k], v) for k, v in drafter.state_dict().items())
