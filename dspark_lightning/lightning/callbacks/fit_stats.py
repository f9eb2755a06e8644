"""``fit_stats.json``: what a fit cost and what it reached (wall time, throughput, peak RSS, the last validation)."""

from __future__ import annotations

import json
import resource
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.trainer.states import TrainerStatus

from ...atomic import atomic_write

FIT_STATS = "fit_stats.json"


def validate_if_stale(trainer: L.Trainer, pl_module: L.LightningModule) -> None:
    """Validate the final weights once more when training went on after the last validation (a run stopped by
    ``trainer.max_time`` between validations), so fit_stats.json and the export report the weights they hold.

    Called from ``on_fit_end`` (after Lightning's own teardown, as a separate ``trainer.validate`` after ``fit`` would
    run); the trainer's fit state is put back afterwards, so the rest of ``fit`` ends as it would have. Nothing when
    the fit validates nothing (no validation data, or ``limit_val_batches: 0``)."""
    if not getattr(pl_module, "validation_is_stale", False) or not trainer.enable_validation:
        return
    state = trainer.state
    fn, stage = state.fn, state.stage
    trainer.validate(pl_module, datamodule=trainer.datamodule, verbose=False)
    state.fn, state.status, state.stage = fn, TrainerStatus.RUNNING, stage


class FitStats(L.Callback):
    """Writes ``<log_dir>/fit_stats.json`` at the end of training (rewritten after a final validation) and prints
    the last validation's table.

    Counts this rank's tokens (``batch["attention_mask"]``) and the supervised block rows and anchors the training
    step reports (its output's ``block_rows`` and ``anchors``) as device tensors, read once at the end."""

    def __init__(self) -> None:
        self.stats: dict[str, Any] | None = None  # the last written fit_stats.json
        self.path: Path | None = None
        self._t0: float | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._t0, self._tokens, self._rows, self._anchors = time.perf_counter(), 0, 0, 0
        self.stats, self.path = None, None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if self._t0 is None:
            return
        if isinstance(batch, Mapping) and "attention_mask" in batch:
            self._tokens = self._tokens + batch["attention_mask"].sum()
        if isinstance(outputs, Mapping):
            self._rows = self._rows + outputs.get("block_rows", 0)
            self._anchors = self._anchors + outputs.get("anchors", 0)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        log_dir = trainer.log_dir  # a collective under DDP: every rank must call it
        if not trainer.is_global_zero or self._t0 is None:
            return
        wall = time.perf_counter() - self._t0
        tokens, rows, anchors = (int(x) for x in (self._tokens, self._rows, self._anchors))  # one read each
        self._base = {
            "steps": int(trainer.global_step),
            "wall_s": wall,
            "tokens": tokens,
            "tokens_per_s": tokens / wall if wall > 0 else 0.0,
            "block_rows_per_s": rows / wall if wall > 0 else 0.0,
            "anchors_seen": anchors,
            "block_rows_seen": rows,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
        self.path = Path(log_dir or ".") / FIT_STATS
        self.write(pl_module)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """A validation after training ended (:func:`validate_if_stale`): the file and the table follow it."""
        if self.path is not None and trainer.is_global_zero:
            self.write(pl_module)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        validate_if_stale(trainer, pl_module)

    def write(self, pl_module: L.LightningModule) -> None:
        """(Re)write fit_stats.json with the module's last validation and print its table."""
        val_step = getattr(pl_module, "_val_step", None)
        validation = getattr(pl_module, "last_validation", {})
        self.stats = {**self._base, "validation_step": val_step, "validation": validation}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, json.dumps(self.stats, indent=2) + "\n")  # rewritten after a final validation
        table = pl_module.validation_table() if hasattr(pl_module, "validation_table") else ""
        if table and not getattr(pl_module, "validation_is_stale", True):
            print(f"[dspark-lightning] validation at step {val_step} (teacher-forced):\n{table}", flush=True)
