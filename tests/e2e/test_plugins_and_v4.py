"""`fit` with a third-party head, and the v4_flash_like recipe on the tiny target; both decode losslessly."""

from pathlib import Path

import pytest
import torch
import yaml

from .conftest import ROOT, TINY

V4 = ROOT / "recipes" / "v4_flash_like.yaml"


def _fit(args):
    from dspark_lightning.cli.fit import DSparkCLI
    from dspark_lightning.lightning.datamodule import DSparkDataModule
    from dspark_lightning.lightning.module import DSparkModule

    cli = DSparkCLI(DSparkModule, DSparkDataModule, args=["fit", *args])
    return cli, Path(cli.trainer.log_dir) / "drafter"


def _greedy_equal(export: Path) -> None:
    from dspark_lightning import load_drafter, load_target
    from dspark_lightning.infer import decode

    target = load_target("tiny-debug")
    drafter = load_drafter(export, target)
    prompts = [target.encode_prompt(t) for t in ("hello", "17*23 = ?")]
    res = decode(target, drafter, prompts, max_new_tokens=12)
    for p, out in zip(prompts, res.token_ids, strict=True):
        ref = target.model.generate(
            torch.tensor([p]), do_sample=False, max_new_tokens=12, eos_token_id=target.stop_token_ids, pad_token_id=0
        )
        assert out == ref[0, len(p) :].tolist()


@pytest.mark.parametrize("by", ["name", "class_path"])
def test_fit_with_plugin_head_then_decode(workdir, tmp_path, by):
    """A recipe names the installed plugin's head (registry name or class path); fit trains it; decode is lossless."""
    head = "bigram_markov" if by == "name" else {"class_path": "dspark_example_head.BigramMarkovHead"}
    recipe = tmp_path / "plugin_recipe.yaml"
    recipe.write_text(
        yaml.safe_dump(  # no server knows a plugin's head: the recipe trains for none
            {
                "model": {"seq_head": head},
                "trainer": {"max_steps": 1, "val_check_interval": 1},
                "export": {"servers": []},
            }
        )
    )
    cli, export = _fit(["--config", TINY, "--config", str(recipe)])
    cfg = yaml.safe_load((export / "config.json").read_text())
    assert cfg["seq_head"]["class_path"] == "bigram_markov"
    _greedy_equal(export)


def test_v4_flash_like_recipe_trains_on_the_tiny_target(workdir, tmp_path):
    tiny = yaml.safe_load(Path(TINY).read_text())
    override = tmp_path / "tiny_override.yaml"
    override.write_text(
        yaml.safe_dump(
            {
                "trainer": {
                    "max_steps": 3,
                    "val_check_interval": 3,
                    "log_every_n_steps": 1,
                    "enable_model_summary": False,
                },
                "target": tiny["target"],
                "data": tiny["data"],
                "model": {
                    "backbone": {"init_args": {"sliding_window": 8, "expert_hidden": 32, "shared_expert_hidden": 32}},
                    "seq_head": {"init_args": {"rank": 16}},
                },
            }
        )
    )
    cli, export = _fit(["--config", str(V4), "--config", str(override)])
    from lightning.pytorch.loggers import CSVLogger

    from dspark_lightning.layers import moe_loads

    bb = cli.model.drafter.backbone
    assert bb.layer_windows == [8] * len(bb.layers)  # the override reaches every layer
    loads = moe_loads(bb)
    assert loads  # an MoE backbone: each layer's every expert is logged
    csv_dir = next(lg.log_dir for lg in cli.trainer.loggers if isinstance(lg, CSVLogger))
    header = (Path(csv_dir) / "metrics.csv").read_text().splitlines()[0]
    last = f"moe/load_layer{len(loads) - 1}_expert{loads[-1].numel() - 1}"
    assert "train/moe_aux" in header and "moe/imbalance_layer0" in header and last in header
    _greedy_equal(export)
