"""Every registered drafter: one training step through DSparkModule, then an export/load round trip."""

import inspect

import pytest
import torch

from dspark_lightning import names
from dspark_lightning.checkpoint import load_drafter, save_drafter
from dspark_lightning.lightning.module import DSparkModule, LossConfig
from dspark_lightning.registry import get


def _spec(name):
    if "backbone" not in inspect.signature(get("drafter", name)).parameters:
        return name
    return {"class_path": name, "init_args": {"backbone": {"class_path": "dense", "init_args": {"num_layers": 1}}}}


@pytest.mark.parametrize("name", names("drafter"))
def test_train_step_and_export_round_trip(tiny_batch, name, tmp_path):
    torch.manual_seed(0)
    loss = LossConfig(ce_weight=0.5, l1_weight=0.5, conf_weight=1.0, soft_ce_weight=0.5, decay=4.48)
    module = DSparkModule(drafter=_spec(name), block_size=3, target="tiny-debug", loss=loss).train()
    context, hidden, ids = tiny_batch
    batch = {
        "input_ids": ids,
        "context": context,
        "hidden": hidden,
        "anchors": torch.tensor([[3, 9, 15], [5, 11, 0]]),
        "valid": torch.tensor([[True, True, True], [True, True, False]]),
        "loss_mask": torch.ones_like(ids),
    }
    terms, v, _ = module._step(batch)
    assert v.shape == (2, 3, 3) and torch.isfinite(terms.total)
    assert terms.soft_ce > 0 and terms.l1 > 0
    terms.total.backward()
    params = dict(module.drafter.named_parameters())
    assert params and all(p.grad is not None and torch.isfinite(p.grad).all() for p in params.values())
    assert module.target.lm_head.weight.grad is None  # the shared LM head stays frozen

    drafter = module.drafter.eval()
    out = save_drafter(drafter, tmp_path / "d", module.target)
    again = load_drafter(out, module.target)
    assert type(again) is type(drafter) and again.block_size == 3
    with torch.no_grad():
        a = drafter(context, ids, batch["anchors"], batch["valid"], hidden=hidden).logits
        b = again(context, ids, batch["anchors"], batch["valid"], hidden=hidden).logits
    torch.testing.assert_close(a, b)


def test_drafter_and_parts_are_exclusive():
    with pytest.raises(ValueError, match="either model.drafter"):
        DSparkModule(backbone="dense", drafter="eagle3", target="tiny-debug")
    with pytest.raises(ValueError, match="model.backbone is required"):
        DSparkModule(target="tiny-debug")
