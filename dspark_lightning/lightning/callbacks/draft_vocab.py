"""The reduced draft vocabulary (FR-Spec), chosen from the training responses when a run sets up."""

from __future__ import annotations

import lightning as L

from ...data.features.vocab import coverage, frequent_tokens


class DraftVocabulary(L.Callback):
    """When the drafter has a reduced vocabulary not chosen yet (``model.draft_vocab_size``), pick its N most
    frequent target tokens of the datamodule's training responses (``token_counts("train")``; the target's stop
    tokens always included) and say how much of the training and held-out responses it covers. A resumed
    checkpoint restores the same choice (it is a buffer of the drafter)."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        d = getattr(pl_module, "drafter", None)
        if getattr(d, "draft_vocab", None) is None or d.vocab_ready:
            return
        dm = trainer.datamodule
        if not hasattr(dm, "token_counts"):
            raise ValueError("model.draft_vocab_size needs a datamodule with token_counts() (the DSpark datamodule)")
        counts = dm.token_counts("train")
        ids = frequent_tokens(counts, d.draft_vocab.numel(), always=pl_module.target.stop_token_ids)
        d.set_draft_vocab(ids)
        held = dm.token_counts("heldout")
        print(
            f"[dspark-lightning] draft vocabulary: {ids.numel()} of {counts.numel()} tokens, covering "
            f"{100 * coverage(counts, ids):.2f}% of training and {100 * coverage(held, ids):.2f}% of held-out "
            "response tokens",
            flush=True,
        )
