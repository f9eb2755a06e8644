"""DSparkModule: trains a drafter against a frozen target (the only LightningModule).

The module builds the drafter (its draft vocabulary chosen in :meth:`DSparkModule.setup`) and holds the training
step, validation and the optimizer; what a fit does around them (the divergence guard, MoE logging, fit_stats.json,
the export) are the Callbacks of ``callbacks/``, which :meth:`DSparkModule.configure_callbacks` adds to any Trainer
that lacks them. The recipe's target, loss and optimizer sections and their checks are in ``config.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict

import lightning as L
import torch
from torch import nn

from .. import checks
from ..checks import UsageError
from ..data.features.extract import features_for_batch, target_law_summary
from ..data.features.vocab import coverage, frequent_tokens
from ..data.prompts.sources import DOMAINS as PROMPT_DOMAINS
from ..drafters import build_drafter
from ..drafters.warm_start import WarmStart, from_drafter
from ..drafters.warm_start import warm_start as warm_start_fn
from ..layers import moe_aux_loss
from ..losses import ProjectedLogits, dspark_loss, position_weights, supervision_mask
from ..targets import Target, TargetGeometry
from .callbacks import TrainingDiverged, default_callbacks, full_drafter_state
from .config import (
    TRUE_PRECISIONS,
    LossConfig,
    OptimConfig,
    TargetConfig,
    as_config,
    check_hparams,
    check_phase_anchors,
    check_precision,
    target_config,
)
from .metrics import PositionAcceptance, acceptance_table
from .pairing import check_pairing
from .schedule import Phase, check_curriculum, lr_factor, phase_at, subsample_anchors

__all__ = ["TRUE_PRECISIONS", "DSparkModule", "LossConfig", "OptimConfig", "TrainingDiverged", "check_hparams",
           "full_drafter_state"]  # fmt: skip

DOMAINS = (*PROMPT_DOMAINS, "other")  # validation metrics: a batch without domains counts as "other"


class DSparkModule(L.LightningModule):
    """A drafter composed from injected parts, trained against a frozen target.

    Args:
        backbone: builds the backbone from the target geometry (recipe: class_path + init_args), or a
            registered name (``dense``, ``moe_swa``, a plugin's) with default arguments.
        seq_head: builds the sequential head, or a registered name (null = none, e.g. the DFlash baseline).
        conf_head: builds the confidence head from (geometry, token_dim), or a registered name (null = none).
        block_size: γ, drafts per block.
        target: the frozen target (:class:`~.config.TargetConfig`, or its name): the recipe's ``target:`` section,
            which ``dspark-lightning fit`` gives to the model and the data alike.
        mask_token_id: token id for mask slots (null = the target's default unused special token).
        drafter: a registered drafter built whole instead of from parts: a name (``eagle3``, ``mtp1``) or
            ``{class_path: NAME, init_args: {...}}``; ``block_size`` is passed to it.
        draft_vocab_size: reduced draft vocabulary (FR-Spec): the drafter's LM head, sequential-head output and
            sampling law cover the N most frequent target tokens of the training responses (stop tokens always
            included), chosen in :meth:`setup` from the datamodule's ``token_counts`` (a resumed checkpoint restores
            the same choice); null = the whole target vocabulary. Lossless either way.
        loss: loss weights and position decay.
        optim: optimizer and schedule.
        curriculum: training phases (block length, anchors per sequence, position decay) over training progress,
            e.g. a slot-1-first curriculum ``[{until: 0.7, block_size: 3, anchors: 96, decay: 1.5}, {until: 1.0}]``;
            validation and the export always use ``block_size``. null = one phase.
        warm_start: initialise the backbone from the target's layers (``drafters/warm_start.py``); null = the
            random initialisation of docs/algorithm.md §3.1.
        init_from: a drafter folder to continue from (our export, a DeepSpec / vLLM ``dspark-hf`` or an
            ``eagle3-hf`` folder): every tensor of the same name and shape is copied, draft-vocabulary rows are
            remapped by token id, the rest stays fresh (:func:`~dspark_lightning.drafters.warm_start.from_drafter`;
            what was reused is printed). Applied after ``warm_start``; a resumed checkpoint's weights replace both.
    """

    def __init__(
        self,
        backbone: Callable[[TargetGeometry], nn.Module] | str | None = None,
        seq_head: Callable[[TargetGeometry], nn.Module] | str | None = None,
        conf_head: Callable[[TargetGeometry, int], nn.Module] | str | None = None,
        block_size: int = 7,
        target: TargetConfig | str = "tiny-debug",
        mask_token_id: int | None = None,
        loss: LossConfig | None = None,
        optim: OptimConfig | None = None,
        drafter: str | dict | None = None,
        draft_vocab_size: int | None = None,
        curriculum: list[Phase] | None = None,
        warm_start: WarmStart | None = None,
        init_from: str | None = None,
    ) -> None:
        super().__init__()
        self.loss_cfg = as_config(loss, LossConfig, "model.loss")
        self.optim_cfg = as_config(optim, OptimConfig, "model.optim")
        check_hparams(self.loss_cfg, self.optim_cfg, block_size)
        self.curriculum = [p if isinstance(p, Phase) else Phase(**p) for p in curriculum or []]
        check_curriculum(self.curriculum, block_size)
        tgt = target_config(target).load()
        self.__dict__["_target"] = tgt  # not a sub-module: never trained, saved or wrapped by DDP
        self.drafter = build_drafter(tgt, block_size, drafter=drafter, backbone=backbone, seq_head=seq_head,
                                     conf_head=conf_head, mask_token_id=mask_token_id,
                                     draft_vocab_size=draft_vocab_size)  # fmt: skip
        if warm_start is not None:
            ws = as_config(warm_start, WarmStart, "model.warm_start")
            copied = warm_start_fn(self.drafter, tgt, ws)
            print(f"[dspark-lightning] warm start: drafter layers from target layers {copied}", flush=True)
        self.__dict__["_init_from"] = None if init_from is None else (init_from, _load_source(init_from, tgt))
        self.block_size = block_size
        self.register_buffer("pos_w", position_weights(block_size, self.loss_cfg.decay), persistent=False)
        self.val_acc = PositionAcceptance(block_size, DOMAINS)  # analytic acceptance c*_k (T = 1)
        self.val_agree = PositionAcceptance(block_size, DOMAINS)  # argmax agreement TF-A_k (T = 0)
        self.last_validation: dict[str, dict[str, list[float] | float]] = {}

    @property
    def target(self) -> Target:
        return self.__dict__["_target"]

    def describe(self) -> dict:
        return {
            "loss": asdict(self.loss_cfg),
            "optim": asdict(self.optim_cfg),
            "target": self.target.describe(),
            "drafter": self.drafter.config(),
            "curriculum": [asdict(p) for p in self.curriculum],
        }

    def setup(self, stage: str) -> None:
        """Check this module's target features against the datamodule's (:func:`~.pairing.check_pairing`: every route
        to training passes here), the precision against the target's dtype and the curriculum against the loader's
        anchors; then choose the reduced draft vocabulary, if the drafter has one not chosen yet."""
        dm = getattr(self.trainer, "datamodule", None)
        if dm is not None and hasattr(dm, "target_config"):  # a DSparkDataModule: its target describes the features
            check_pairing(self.target, dm.target)
        check_precision(str(self.trainer.precision), self.target.lm_head.weight.dtype)
        check_phase_anchors(self.curriculum, getattr(dm, "max_anchors", None))
        clip = getattr(self.trainer, "gradient_clip_val", None)
        if self.optim_cfg.fused is True and "mixed" in str(self.trainer.precision) and clip:
            raise UsageError(f"model.optim.fused: true cannot run with trainer.precision {self.trainer.precision} "
                             f"and trainer.gradient_clip_val {clip}: Lightning's mixed-precision plugin cannot clip a "
                             "fused optimizer's gradients; set model.optim.fused: null (the default picks) or false, "
                             "or drop the clipping")  # fmt: skip
        if self.__dict__["_init_from"] is not None:
            path, src = self.__dict__["_init_from"]
            d, sv = self.drafter, getattr(src, "draft_vocab", None)
            if sv is not None and d.draft_vocab is not None and sv.numel() != d.draft_vocab.numel():
                self._choose_draft_vocab(dm)  # another size: this run's tokens, the source's rows remapped
            print(f"[dspark-lightning] init_from {path}: {from_drafter(d, src, str(path)).summary()}", flush=True)
            self.__dict__["_init_from"] = None
        self._choose_draft_vocab(dm)

    def _choose_draft_vocab(self, dm) -> None:
        """The drafter's N most frequent target tokens of the training responses (the target's stop tokens always
        included), said with how much of the training and held-out responses they cover."""
        d = self.drafter
        if getattr(d, "draft_vocab", None) is None or d.vocab_ready:
            return
        if not hasattr(dm, "token_counts"):
            raise UsageError("model.draft_vocab_size needs a datamodule with token_counts() (the DSpark datamodule)")
        counts = dm.token_counts("train")
        ids = frequent_tokens(counts, d.draft_vocab.numel(), always=self.target.stop_token_ids)
        d.set_draft_vocab(ids)
        held = dm.token_counts("heldout")
        print(f"[dspark-lightning] draft vocabulary: {ids.numel()} of {counts.numel()} tokens, covering "
              f"{100 * coverage(counts, ids):.2f}% of training and {100 * coverage(held, ids):.2f}% of held-out "
              "response tokens", flush=True)  # fmt: skip

    def configure_callbacks(self) -> list[L.Callback]:
        """The default callbacks (:func:`~.callbacks.default_callbacks`) of each kind the Trainer has none of: a plain
        ``Trainer.fit(module, datamodule)`` trains, checks and exports like ``dspark-lightning fit``; a Trainer given
        its own (``DrafterExport(dir=...)``, ``DrafterExport(enabled=False)``) keeps it."""
        have = list(self.trainer.callbacks) if self._trainer is not None else []
        return [cb for cb in default_callbacks() if not any(isinstance(c, type(cb)) for c in have)]

    def drafter_state_dict(self) -> dict[str, torch.Tensor]:
        """The drafter's full weights for the export: :func:`full_drafter_state` of the strategy's (possibly FSDP
        or DDP wrapped) model. A collective: every rank calls it; rank 0 gets the weights."""
        return full_drafter_state(self.trainer.strategy.model)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # Not as hyper_parameters: LightningCLI re-parses those as init args on --ckpt_path (config.yaml has them).
        checkpoint["dspark"] = self.describe()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Say which step a resumed run starts from (``fit --ckpt_path last``)."""
        step, epoch = checkpoint.get("global_step"), checkpoint.get("epoch")
        print(f"[dspark-lightning] restored the checkpoint of step {step} (epoch {epoch})", flush=True)

    # --- one shared step ---------------------------------------------------------------------
    def _target_on_device(self, online: bool) -> Target:
        """The target with what this step reads on ``self.device``: all of it online, and only the embedding and
        LM head with cached features (which hold the final-norm hidden states already). Moved once, not per step."""
        tgt = self.target
        parts = [tgt] if online else [tgt.embed_tokens, tgt.lm_head]
        for m in parts:
            if any(p.device != self.device for p in m.parameters()):
                m.to(self.device)
        return tgt

    def progress(self) -> float:
        """Training progress in [0, 1] (module docstring of ``schedule.py``): steps, or wall time with a budget."""
        total = max(1, int(self.trainer.estimated_stepping_batches)) if self._trainer is not None else 1
        p = self.global_step / total
        budget = self.optim_cfg.time_budget_s
        if budget is not None and hasattr(self, "_train_t0"):
            p = max(p, (time.perf_counter() - self._train_t0) / budget)
        return min(p, 1.0)

    def _phase(self) -> tuple[int, int | None, torch.Tensor]:
        """(training block length, anchors per sequence or None = all, position weights) of this step."""
        ph = phase_at(self.curriculum, self.progress()) if self.training else None
        if ph is None:
            return self.block_size, None, self.pos_w
        g = ph.block_size or self.block_size
        decay = self.loss_cfg.decay if ph.decay is None else ph.decay
        return g, ph.anchors, position_weights(g, decay).to(self.pos_w)

    def _target_law(self, batch: dict, rows: torch.Tensor, hid_idx: torch.Tensor, tgt: Target):
        """The target side of the loss in the draft-vocabulary space: the head over the N draft rows, and the
        full-vocabulary log-sum-exp and argmax of each supervised row, read from the cache when it holds them
        (else computed here, exactly, from the full head)."""
        w = self.drafter.draft_head_weight()  # the N rows of the target LM head the drafter projects onto

        def head(h: torch.Tensor) -> torch.Tensor:
            return tgt.finish_logits(self.drafter.draft_logits(h, w))

        n, g = rows.shape[:2]
        if "target_lse" in batch and "target_top" in batch:
            lse = torch.gather(batch["target_lse"].float(), 1, hid_idx).view(n, g)
            top = torch.gather(batch["target_top"].long(), 1, hid_idx).view(n, g)
        else:
            lse, top = target_law_summary(tgt, rows)
        return head, lse, top.long()

    def _step(self, batch: dict) -> tuple:
        ids, anchors, valid = batch["input_ids"], batch["anchors"], batch["valid"]
        tgt = self._target_on_device(online="context" not in batch)
        if "context" in batch:  # cached features
            context, hidden = batch["context"], batch["hidden"]
        else:  # online: frozen target forward, no grad, rounded like the cache
            context, hidden = features_for_batch(
                tgt, ids, batch["attention_mask"], self.trainer.datamodule.feature_dtype
            )
        B, S = ids.shape
        g, n_anchors, pos_w = self._phase()
        if n_anchors is not None:  # a curriculum phase with fewer anchors than the loader sampled
            gen = torch.Generator().manual_seed(int(self.global_step) * 7919 + 17)
            anchors, valid = subsample_anchors(anchors, valid, n_anchors, gen)
        c = self.loss_cfg
        vocab = getattr(self.drafter, "draft_vocab", None)
        subset = vocab is not None and c.draft_vocab_space
        kw = {"block_size": g} if g != self.block_size else {}
        if subset:
            kw["full_vocab"] = False
        dt = next(self.drafter.parameters()).dtype  # features enter the drafter in its weights' dtype
        out = self.drafter(context.to(dt), ids, anchors, valid, hidden=hidden.to(dt), **kw)
        v = supervision_mask(anchors, valid, batch["loss_mask"], g)  # (B, A, γ)
        k = torch.arange(g, device=ids.device)
        lab_idx = (anchors[:, :, None] + k + 1).clamp(max=S - 1)  # label x_{a+k}
        labels = torch.gather(ids, 1, lab_idx.flatten(1)).view_as(lab_idx).flatten(0, 1)  # (B*A, γ)
        hid_idx = (anchors[:, :, None] + k).clamp(max=S - 1).flatten(1)  # target hidden at a+k-1 predicts x_{a+k}
        rows = torch.gather(hidden, 1, hid_idx[..., None].expand(-1, -1, hidden.shape[-1]))  # (B, A*γ, d)
        rows = rows.to(tgt.lm_head.weight.dtype).view(B * anchors.shape[1], g, -1)  # (B*A, γ, d)
        # Target logits are skipped only when training needs none (CE-only, no confidence head); validation always
        # computes them so the analytic acceptance is comparable across drafters. The loss projects them chunk by
        # chunk, never all (B*A*γ x V) at once.
        need = c.l1_weight > 0 or c.soft_ce_weight > 0 or c.top_ce_weight > 0
        need = need or out.conf_logits is not None or not self.training
        head, lse, top = tgt.logits, None, None
        if need and subset:
            head, lse, top = self._target_law(batch, rows, hid_idx.view(B, -1), tgt)
            inv = self.drafter.vocab_index()  # (V,) target id -> draft-vocabulary index, -1 outside
            labels, top = inv[labels], inv[top]
        elif subset:
            labels = self.drafter.vocab_index()[labels]
        terms = dspark_loss(
            out.logits.flatten(0, 1),
            ProjectedLogits(rows, head) if need else None,
            labels,
            v.flatten(0, 1),
            pos_w,
            None if out.conf_logits is None else out.conf_logits.flatten(0, 1),
            c.ce_weight,
            c.l1_weight,
            c.conf_weight,
            c.soft_ce_weight,
            c.chunk_size,
            target_lse=lse,
            target_top=top,
            top_ce_weight=c.top_ce_weight,
            conf_label=c.conf_label,
        )
        self._step_anchors = valid.sum()  # a device tensor: no host read
        return terms, v, B

    def _log_terms(self, prefix: str, terms, v: torch.Tensor, B: int) -> None:
        """Log device tensors: Lightning reads them on the host only when it sends them to the loggers (every
        ``log_every_n_steps``; validation's, all-reduced with ``sync_dist``, once per epoch). Progress-bar values are
        the exception (read at every batch end, whatever the bar's refresh rate), so the training step shows
        host copies, taken at logging steps only (:meth:`_show_progress`)."""
        on_step = prefix == "train"
        kw = {"on_step": on_step, "on_epoch": not on_step, "batch_size": B, "sync_dist": not on_step}
        self.log(f"{prefix}/loss", terms.total, prog_bar=not on_step, **kw)
        self.log(f"{prefix}/ce", terms.ce, **kw)
        self.log(f"{prefix}/l1", terms.l1, **kw)
        if self.loss_cfg.soft_ce_weight > 0:
            self.log(f"{prefix}/soft_ce", terms.soft_ce, **kw)
        if self.loss_cfg.top_ce_weight > 0:
            self.log(f"{prefix}/top_ce", terms.top_ce, **kw)
        self.log(f"{prefix}/conf_bce", terms.conf, **kw)
        vm = v.flatten(0, 1)
        n = vm.sum().clamp_min(1)
        acc_mean = (terms.acc * vm).sum() / n
        self.log(f"{prefix}/acc_mean", acc_mean, **kw)
        if on_step:
            self._show_progress(terms.total, acc_mean, B)
        if terms.agree is not None:
            self.log(f"{prefix}/tfa_mean", (terms.agree * vm).sum() / n, **kw)
        if terms.conf_prob is not None:
            err = terms.conf_prob - terms.acc
            self.log(f"{prefix}/conf_abs_err", (err.abs() * vm).sum() / n, **kw)
            self.log(f"{prefix}/conf_bias", (err * vm).sum() / n, **kw)

    def _logging_step(self) -> bool:
        """Whether Lightning sends this batch's metrics to the loggers: every ``log_every_n_steps`` optimizer steps,
        at the last micro-batch of an accumulation (as ``_LoggerConnector.update_train_step_metrics`` decides)."""
        try:
            trainer = self.trainer
            return trainer._logger_connector.should_update_logs and not trainer.fit_loop._should_accumulate()
        except (AttributeError, RuntimeError):  # another Lightning, or no trainer: every step
            return True

    def _show_progress(self, loss: torch.Tensor, acc_mean: torch.Tensor, B: int) -> None:
        """Keep this step's loss and acc_mean for the progress bar when it is a logging step (see
        :meth:`on_train_batch_end`)."""
        if self._logging_step():
            self._progress = (torch.stack([loss.detach(), acc_mean.detach()]).float(), B)

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        """The progress bar's ``loss`` and ``acc``: host copies made at logging steps only, after the step's backward
        and optimizer step are queued, where the loggers read the same values anyway; shown until the next logging
        step (a host tensor costs no device sync at the batch ends in between)."""
        progress, self._progress = getattr(self, "_progress", None), None
        if progress is None:
            return
        shown, B = progress[0].cpu(), progress[1]
        self.log("loss", shown[0], prog_bar=True, logger=False, on_step=True, on_epoch=False, batch_size=B)
        self.log("acc", shown[1], prog_bar=True, logger=False, on_step=True, on_epoch=False, batch_size=B)

    def on_train_start(self) -> None:
        self._train_t0 = time.perf_counter()  # the clock of a time-budgeted schedule (progress())

    @property
    def validation_is_stale(self) -> bool:
        """True when training went on after the last validation (a run stopped by ``trainer.max_time``)."""
        return getattr(self, "_val_step", None) != int(self.global_step)

    def on_train_epoch_start(self) -> None:
        dm = getattr(self.trainer, "datamodule", None)
        if hasattr(dm, "set_epoch"):
            dm.set_epoch(self.current_epoch)

    def training_step(self, batch: dict, batch_idx: int) -> dict[str, torch.Tensor]:
        """No host read: the loss, the logged tensors and the counts stay on the device. Returns the loss and this
        step's supervised block rows (a curriculum phase trains fewer) and anchors, which :class:`~.callbacks.FitStats`
        adds up; ``step_losses`` (loss, ce, l1, conf: detached) is left for :class:`~.callbacks.DivergenceGuard`,
        which checks it before the backward (one host read per optimizer step)."""
        terms, v, B = self._step(batch)
        self._log_terms("train", terms, v, B)
        loss = terms.total + self._moe_aux(B)
        self.step_losses = torch.stack([t.detach().float() for t in (loss, terms.ce, terms.l1, terms.conf)])
        return {"loss": loss, "block_rows": v.detach().sum(), "anchors": self._step_anchors}

    def _moe_aux(self, B: int) -> torch.Tensor | float:
        """MoE backbones: the weighted auxiliary balance loss, logged (the expert loads: ``callbacks.MoELogging``)."""
        bb = getattr(self.drafter, "backbone", None)
        aux = moe_aux_loss(bb) if bb is not None else None
        if aux is None:
            return 0.0
        self.log("train/moe_aux", aux, on_step=True, batch_size=B)
        return getattr(bb, "aux_loss_weight", 0.01) * aux

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        terms, v, B = self._step(batch)
        self._log_terms("val", terms, v, B)
        A = batch["anchors"].shape[1]
        domains = [d for d in batch.get("domains", ["other"] * B) for _ in range(A)]
        self.val_acc.update(terms.acc, v.flatten(0, 1), domains)
        if terms.agree is not None:
            self.val_agree.update(terms.agree, v.flatten(0, 1), domains)

    test_step = validation_step

    def _log_acceptance(self, prefix: str) -> None:
        """Per domain and overall: c*_k and τ̂ (T = 1, analytic), TF-A_k and the greedy τ̂ (T = 0, argmax
        agreement), all teacher-forced; kept in ``last_validation`` for the end-of-fit table."""
        names = [*DOMAINS, "all"]
        table: dict[str, dict[str, list[float] | float]] = {}
        for metric, key, tau_key in ((self.val_acc, "acc_pos", "tau_hat"), (self.val_agree, "tfa_pos", "tau_greedy")):
            num, den, tau_sum, blocks = metric.compute()  # (D+1, γ), (D+1,) with the last row = all domains
            for i, dom in enumerate(names):
                if den[i, 0] == 0:
                    continue
                acc = num[i] / den[i].clamp_min(1)
                tau = float(tau_sum[i] / blocks[i].clamp_min(1))  # mean of per-block expected lengths
                sfx = "" if dom == "all" else f"_{dom}"
                self.log(f"{prefix}/{tau_key}{sfx}", tau, prog_bar=dom == "all" and tau_key == "tau_hat")
                for k in range(self.block_size):
                    self.log(f"{prefix}/{key}{k + 1}{sfx}", acc[k])
                row = table.setdefault(dom, {"blocks": float(blocks[i])})
                row[key] = [float(a) for a in acc]
                row[tau_key] = tau
            metric.reset()
        self.last_validation = table
        self._val_step = int(self.global_step)

    def validation_table(self, slots: int = 4) -> str:
        """The last validation as a small text table (:func:`~.metrics.acceptance_table`)."""
        return acceptance_table(self.last_validation, self.block_size, slots)

    def on_validation_epoch_end(self) -> None:
        self._log_acceptance("val")

    def on_test_epoch_end(self) -> None:
        self._log_acceptance("test")

    # --- optimisation ------------------------------------------------------------------------
    def configure_optimizers(self):
        o = self.optim_cfg
        params = [p for p in self.drafter.parameters() if p.requires_grad]
        # Lightning's mixed-precision plugin cannot clip the gradients of a fused optimizer (it unscales them itself)
        mixed = "mixed" in str(getattr(self.trainer, "precision", ""))
        fused = (fused_adamw_ok(params) and not mixed) if o.fused is None else bool(o.fused)
        kw = {"fused": True} if fused else {}
        opt = torch.optim.AdamW(params, lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay, **kw)
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warm = max(1, int(o.warmup_fraction * total)) if o.time_budget_s is None else 0

        def factor(step: int) -> float:
            if o.time_budget_s is None:  # step-based (docs/algorithm.md §4): warmup over `warm` steps, then schedule
                if step < warm:
                    return (step + 1) / warm
                return lr_factor((step - warm) / max(1, total - warm), 0.0, o.schedule, o.decay_fraction)
            return lr_factor(self.progress(), o.warmup_fraction, o.schedule, o.decay_fraction)

        sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def fused_adamw_ok(params: list[torch.Tensor]) -> bool:
    """Whether AdamW's fused kernel takes these parameters: plain floating CPU/CUDA tensors of one device (FSDP2's
    DTensors and other subclasses keep the default implementation)."""
    if not params or any(type(p) is not torch.nn.Parameter or hasattr(p, "to_local") for p in params):
        return False
    devices = {p.device.type for p in params}
    return len(devices) == 1 and devices <= {"cpu", "cuda"} and all(p.is_floating_point() for p in params)


def _load_source(path: str, target: Target) -> nn.Module:
    """The drafter at ``path`` (any folder ``load_drafter`` reads), checked to read the layers this run taps."""
    from ..checkpoint.native import load_drafter_checked

    taps = list(target.geometry.layer_ids)
    src = load_drafter_checked(path, target)
    if list(target.geometry.layer_ids) != taps:
        read = list(target.geometry.layer_ids)
        target.tap(taps)
        raise checks.UsageError(f"model.init_from: {path} reads target layers {read}, this recipe taps {taps}: set "
                                f"target.layer_ids: {read} to continue from it")  # fmt: skip
    return src
