"""MoE backbones: each layer's expert load, logged every training step."""

from __future__ import annotations

from collections.abc import Mapping

import lightning as L

from ...layers import moe_loads


class MoELogging(L.Callback):
    """Logs ``moe/imbalance_layer{i}`` (max load x experts: 1 = balanced) and ``moe/load_layer{i}_expert{e}`` of the
    training step's routing (the loads the MoE layers keep from their last forward). Nothing for a dense backbone.
    The auxiliary balance loss is part of the training loss (``DSparkModule``: ``train/moe_aux``)."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        bb = getattr(getattr(pl_module, "drafter", None), "backbone", None)
        if bb is None:
            return
        B = batch["input_ids"].shape[0] if isinstance(batch, Mapping) and "input_ids" in batch else None
        for i, load in enumerate(moe_loads(bb)):
            pl_module.log(f"moe/imbalance_layer{i}", load.max() * load.numel(), on_step=True, batch_size=B)
            for e, f in enumerate(load):
                pl_module.log(f"moe/load_layer{i}_expert{e}", f, on_step=True, batch_size=B)
