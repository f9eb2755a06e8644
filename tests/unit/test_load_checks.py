"""Loading a drafter into a target it was not trained for is refused, and the CLIs load the target it expects."""

import pytest
import torch

from dspark_lightning import create, load_target
from dspark_lightning.checkpoint import (
    DrafterLoadError,
    check_compatible,
    load_drafter,
    recorded_target_args,
    save_drafter,
)
from dspark_lightning.targets import ChatFormat


@pytest.fixture(scope="module")
def exported(tiny_target, tmp_path_factory):
    torch.manual_seed(0)
    d = create(
        "drafter", "dspark", tiny_target, block_size=3, backbone={"class_path": "dense", "init_args": {"num_layers": 1}}
    )
    return save_drafter(d, tmp_path_factory.mktemp("d") / "drafter", tiny_target)


def test_a_target_with_another_chat_format_is_refused(exported, tiny_target):
    other = load_target("tiny-debug", chat=ChatFormat(system_prompt="You are terse."))
    with pytest.raises(DrafterLoadError, match="chat format"):
        load_drafter(exported, other)
    assert load_drafter(exported, tiny_target) is not None


def test_the_convention_key_is_required(exported, tiny_target):
    import json

    cfg = json.loads((exported / "config.json").read_text())
    check_compatible(cfg, tiny_target, "d")
    del cfg["convention"]
    with pytest.raises(DrafterLoadError, match="no 'convention' key"):
        check_compatible(cfg, tiny_target, "d")


def test_recorded_target_args_reproduce_the_training_target(exported, tiny_target):
    args = recorded_target_args(exported)
    assert args["layer_ids"] == list(tiny_target.geometry.layer_ids)
    assert args["chat"] == tiny_target.chat
