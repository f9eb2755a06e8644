"""A drafter is never trained on target features it will not see when served: the module and its data are checked
against each other on every route (here the plain ``Trainer.fit`` route, which has no CLI argument links)."""

from pathlib import Path

import pytest
import torch
import yaml

from .conftest import TINY


def _data(**over):
    from dspark_lightning.lightning.datamodule import DSparkDataModule

    recipe = yaml.safe_load(Path(TINY).read_text())
    return DSparkDataModule(**{**recipe["data"], "target": {**recipe["target"], **over}})


def _fit(module, dm, root: Path):
    import lightning as L

    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        default_root_dir=root)  # fmt: skip
    trainer.fit(module, dm)
    return trainer


def _module(**target):
    from dspark_lightning.lightning.module import DSparkModule

    torch.manual_seed(0)
    return DSparkModule(
        backbone="dense",
        seq_head={"class_path": "vanilla", "init_args": {"rank": 16}},
        conf_head="linear",
        block_size=4,
        target={"name": "tiny-debug", **target},
    )


@pytest.mark.parametrize(
    ("module_kw", "data_kw", "named"),
    [
        ({"layer_ids": [2, 3, 4, 5, 6]}, {}, "layer_ids: model [2, 3, 4, 5, 6], data [1, 2, 3, 4, 5]"),
        ({"system_prompt": "You are terse."}, {}, "chat format"),
        ({}, {"system_prompt": "You are terse."}, "chat format"),
        ({"dtype": "bf16"}, {}, "target dtype: model 'bfloat16', data 'float32'"),
    ],
)
def test_a_module_and_data_built_for_other_features_refuse_before_training(workdir, module_kw, data_kw, named):
    from dspark_lightning.lightning.pairing import PairingError

    with pytest.raises(PairingError, match="would learn from inputs it will not see") as err:
        _fit(_module(**module_kw), _data(**data_kw), workdir / "run")
    assert named in str(err.value)
    assert not (workdir / "run" / "drafter").exists()  # nothing trained, nothing exported


def test_a_matching_pair_trains_and_exports_what_it_learned_from(workdir):
    from dspark_lightning import load_drafter

    module = _module(layer_ids=[1, 3, 5])
    _fit(module, _data(layer_ids=[1, 3, 5]), workdir / "run")
    assert list(load_drafter(workdir / "run" / "drafter").geometry.layer_ids) == [1, 3, 5]


def test_the_check_names_every_difference():
    from dspark_lightning.lightning.pairing import PairingError, check_pairing
    from dspark_lightning.targets import ChatFormat, load_target

    a = load_target("tiny-debug", layer_ids=[1, 2])
    b = load_target("tiny-debug", layer_ids=[1, 3], chat=ChatFormat(system_prompt="x"))
    check_pairing(a, load_target("tiny-debug", layer_ids=[1, 2]))
    with pytest.raises(PairingError) as err:
        check_pairing(a, b)
    assert "layer_ids" in str(err.value) and "chat format" in str(err.value) and "target dtype" not in str(err.value)
