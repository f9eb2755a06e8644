"""A training progress bar that reads right when the budget is a time limit."""

from __future__ import annotations

from lightning.pytorch.callbacks import RichProgressBar, Timer


class BudgetProgressBar(RichProgressBar):
    """:class:`~lightning.pytorch.callbacks.RichProgressBar` whose epoch line counts against the budget that ends
    training: ``Epoch 3/9`` with ``max_epochs``, ``Epoch 11 · 2:41 of 6:30`` under ``max_time``, ``Epoch 11 ·
    step 1200/5000`` under ``max_steps`` alone (the stock bar prints ``Epoch 11/-2`` when ``max_epochs`` is -1)."""

    def _get_train_description(self, current_epoch: int) -> str:
        trainer = self.trainer
        text = f"Epoch {current_epoch}"
        timer = next((c for c in trainer.callbacks if isinstance(c, Timer)), None)
        limit = getattr(timer, "_duration", None)
        if trainer.max_epochs is not None and trainer.max_epochs >= 0:
            text += f"/{trainer.max_epochs - 1}"
        elif limit is not None:
            text += f" · {_clock(timer.time_elapsed())} of {_clock(limit)}"
        elif trainer.max_steps is not None and trainer.max_steps > 0:
            text += f" · step {trainer.global_step}/{trainer.max_steps}"
        width = len(self.validation_description)
        return f"{text:{width}}" if width > len(text) else text

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if self.progress is not None and self.train_progress_bar_id is not None:  # the clock moves within an epoch
            desc = self._get_train_description(trainer.current_epoch)
            self.progress.update(self.train_progress_bar_id, description=desc)


def _clock(seconds: float) -> str:
    m, s = divmod(int(max(seconds, 0)), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}" if m >= 60 else f"{m}:{s:02d}"
