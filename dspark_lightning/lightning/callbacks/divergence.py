"""Stop a run whose loss or gradients turn non-finite, before they reach the weights (and the export)."""

from __future__ import annotations

from collections.abc import Callable

import lightning as L
import torch


class TrainingDiverged(RuntimeError):
    """A non-finite loss or gradient: ``fit`` stops (exit 2) instead of training on and exporting NaN weights."""


def _loss_text(vals: torch.Tensor) -> str:
    """(loss, ce, l1, conf) -> the divergence message (a host read: only once training has diverged)."""
    loss, ce, l1, conf = vals.tolist()
    return f"non-finite training loss {loss} (ce {ce:.4g}, l1 {l1:.4g}, conf {conf:.4g})"


class DivergenceGuard(L.Callback):
    """Raises :class:`TrainingDiverged` on every rank at the first non-finite training loss or gradient.

    One host read per optimizer step: the loss of each micro-batch (``pl_module.step_losses``, the detached
    (loss, ce, l1, conf) the training step leaves) is kept on the device before its backward, and read together
    with the gradient check before the optimizer step, after one all-reduce across ranks (a non-finite loss gives
    non-finite gradients, which never reach the weights either way). Under a loss scaler (``16-mixed``), whose
    overflow steps are expected and skipped by the scaler itself, the gradients are not checked and the loss is
    read before each backward instead. Stopping, rather than skipping steps, keeps the weights and the checkpoints
    written so far finite.
    """

    def __init__(self) -> None:
        self._pending: tuple[torch.Tensor, torch.Tensor] | None = None

    @staticmethod
    def _scaled(trainer: L.Trainer) -> bool:
        return getattr(trainer.precision_plugin, "scaler", None) is not None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._pending = None

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        """The loss half, without a host read (``loss`` here may be scaled: the module's own values are used)."""
        vals = getattr(pl_module, "step_losses", None)
        if vals is None:
            return
        bad = ~vals[0].isfinite()
        if self._scaled(trainer):
            self._stop_if(trainer, bad, lambda: _loss_text(vals))
            return
        if self._pending is not None:  # keep the values of the first non-finite micro-batch
            bad, vals = self._pending[0] | bad, torch.where(self._pending[0], self._pending[1], vals)
        self._pending = (bad, vals)

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        """Gradients unclipped and unscaled: the loss and gradient flags of this step in one read."""
        if self._scaled(trainer):
            return
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        local = [g.to_local() if hasattr(g, "to_local") else g for g in grads]  # DTensor shards (FSDP2)
        norms = [torch.linalg.vector_norm(g, dtype=torch.float32) for g in local if g.numel()]
        pending, self._pending = self._pending, None
        flags = torch.zeros(2, device=pl_module.device)
        if pending is not None:
            flags[0] = pending[0].to(flags.device)
        if norms:
            flags[1] = (~torch.stack(norms).isfinite().all()).to(flags.device)
        loss_bad, grad_bad = self._any_rank(trainer, flags)
        if loss_bad:
            self._diverged(trainer, _loss_text(pending[1]) if pending is not None else "non-finite training loss on "
                           "another rank")  # fmt: skip
        if grad_bad:
            self._diverged(trainer, "non-finite gradient")

    @staticmethod
    def _any_rank(trainer: L.Trainer, flags: torch.Tensor) -> list[bool]:
        """``flags`` (n,) summed over the ranks on the device, then read on the host: the one host read of a check."""
        return (trainer.strategy.reduce(flags.float(), reduce_op="sum") > 0).tolist()

    def _stop_if(self, trainer: L.Trainer, bad: torch.Tensor, what: Callable[[], str]) -> None:
        """Raise :class:`TrainingDiverged` on every rank when any rank saw ``bad`` (a 0-d bool tensor)."""
        if self._any_rank(trainer, bad.reshape(1))[0]:
            self._diverged(trainer, what())

    @staticmethod
    def _diverged(trainer: L.Trainer, what: str) -> None:
        """Every rank raises together (none is left in a collective)."""
        raise TrainingDiverged(
            f"{what} at step {trainer.global_step}: training diverged and was stopped (nothing exported); "
            "lower model.optim.lr or check model.loss and the data, then resume from an earlier checkpoint "
            "with --ckpt_path or start again"
        )
