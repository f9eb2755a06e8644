"""DSparkModule: trains a drafter against a frozen target (the only LightningModule)."""

from __future__ import annotations

import json
import math
import resource
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import lightning as L
import torch
from torch import nn

from ..data.features import features_for_batch, target_law_summary
from ..data.prepare import write_atomic
from ..data.vocab import coverage, frequent_tokens
from ..devices import resolve_dtype
from ..drafters import build_part, compose, draft_geometry
from ..drafters.warm_start import WarmStart
from ..drafters.warm_start import warm_start as warm_start_fn
from ..losses import ProjectedLogits, dspark_loss, position_weights, supervision_mask
from ..modules import moe_aux_loss, moe_loads
from ..registry import create
from ..targets import ChatFormat, Target, TargetGeometry, load_target
from .metrics import PositionAcceptance
from .schedule import SCHEDULES, Phase, check_curriculum, lr_factor, phase_at, subsample_anchors

DOMAINS = ("math", "code", "chat", "other")
# Precisions that run the drafter's weights in one dtype (no autocast): the shared target parts must match it.
TRUE_PRECISIONS = {
    "64-true": torch.float64,
    "32-true": torch.float32,
    "16-true": torch.float16,
    "bf16-true": torch.bfloat16,
}


@dataclass
class LossConfig:
    """Loss weights (SPEC §4): L = ce_weight·CE + l1_weight·L1 + conf_weight·BCE."""

    ce_weight: float = 0.1
    """weight of the cross-entropy to the data token"""
    l1_weight: float = 0.9
    """weight of the full L1 distance to the target distribution"""
    conf_weight: float = 1.0
    """weight of the confidence BCE against the detached analytic acceptance"""
    soft_ce_weight: float = 0.0
    """weight of the soft cross-entropy to the target distribution (EAGLE-3's loss)"""
    top_ce_weight: float = 0.0
    """weight of a cross-entropy to the target's argmax token (the T = 0 label, free from the target logits)"""
    draft_vocab_space: bool = True
    """with a reduced draft vocabulary, compute the loss over its N tokens only: the target logits of those rows,
    with the full-vocabulary log-sum-exp and argmax cached at feature extraction (or computed once per step
    without a cache), so the mass outside still counts as rejected; equal values and gradients (tested)"""
    decay: float | None = 4.0
    """position weights w_k = exp(-(k-1)/decay); null = uniform"""
    chunk_size: int | None = None
    """anchor blocks per chunk of the per-token loss (activation-checkpointed): bounds the fp32 (rows x V) tensors
    to chunk_size·γ rows (docs/training.md); null = all at once (the CPU recipes: each chunk's terms and target
    logits are computed twice, and their tensors are small there). Set it for large vocabularies on GPUs
    (recipes/gpu/: 32). Changes no value."""


@dataclass
class OptimConfig:
    """AdamW with linear warmup then cosine decay to 0 (SPEC §4)."""

    lr: float = 6e-4
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    warmup_fraction: float = 0.04
    """fraction of the total optimizer steps spent in linear warmup"""
    schedule: str = "cosine"
    """after warmup: cosine (to 0), wsd (constant, then linear to 0 over decay_fraction) or constant"""
    decay_fraction: float = 0.2
    """wsd: share of training spent in the final linear decay"""
    time_budget_s: float | None = None
    """schedule progress by wall-clock time as well: max(step / max_steps, elapsed / time_budget_s) (a fixed-time
    run, e.g. the experiment matrix; pair it with trainer.max_time)"""


class TrainingDiverged(RuntimeError):
    """A non-finite loss or gradient: ``fit`` stops (exit 2) instead of training on and exporting NaN weights."""


def _require(ok: bool, name: str, value: object, rule: str) -> None:
    if not ok:
        raise ValueError(f"{name} must be {rule}, got {value}")


def _finite(v: object) -> bool:
    return isinstance(v, int | float) and math.isfinite(v)


def check_hparams(loss: LossConfig, optim: OptimConfig, block_size: int) -> None:
    """Refuse hyperparameters that can only train NaN weights (a non-finite or non-positive lr, a NaN loss weight,
    ``decay: 0``) or nothing at all, before the target is loaded; the message names the recipe key."""
    _require(isinstance(block_size, int) and block_size >= 1, "model.block_size", block_size, "an integer >= 1")
    weights = {
        k: getattr(loss, k) for k in ("ce_weight", "l1_weight", "conf_weight", "soft_ce_weight", "top_ce_weight")
    }
    for k, v in weights.items():
        _require(_finite(v) and v >= 0, f"model.loss.{k}", v, "finite and >= 0")
    _require(sum(weights.values()) > 0, "one of model.loss.*_weight", 0, "> 0 (an all-zero loss trains nothing)")
    decay_ok = loss.decay is None or (_finite(loss.decay) and loss.decay > 0)
    _require(decay_ok, "model.loss.decay", loss.decay, "finite and > 0 (null = uniform position weights)")
    _require(loss.chunk_size is None or loss.chunk_size >= 1, "model.loss.chunk_size", loss.chunk_size, ">= 1 or null")
    o = optim
    _require(_finite(o.lr) and o.lr > 0, "model.optim.lr", o.lr, "finite and > 0")
    _require(_finite(o.eps) and o.eps > 0, "model.optim.eps", o.eps, "finite and > 0")
    betas_ok = len(o.betas) == 2 and all(_finite(b) and 0 <= b < 1 for b in o.betas)
    _require(betas_ok, "model.optim.betas", tuple(o.betas), "two numbers in [0, 1)")
    _require(_finite(o.weight_decay) and o.weight_decay >= 0, "model.optim.weight_decay", o.weight_decay, ">= 0")
    _require(_finite(o.warmup_fraction) and 0 <= o.warmup_fraction <= 1, "model.optim.warmup_fraction",
             o.warmup_fraction, "in [0, 1]")  # fmt: skip
    _require(o.schedule in SCHEDULES, "model.optim.schedule", o.schedule, f"one of {', '.join(SCHEDULES)}")
    _require(_finite(o.decay_fraction) and 0 < o.decay_fraction <= 1, "model.optim.decay_fraction",
             o.decay_fraction, "in (0, 1]")  # fmt: skip
    budget_ok = o.time_budget_s is None or (_finite(o.time_budget_s) and o.time_budget_s > 0)
    _require(budget_ok, "model.optim.time_budget_s", o.time_budget_s, "> 0 seconds or null")
    _require(_finite(loss.top_ce_weight) and loss.top_ce_weight >= 0, "model.loss.top_ce_weight",
             loss.top_ce_weight, "finite and >= 0")  # fmt: skip


def _loss_text(vals: torch.Tensor) -> str:
    """(loss, ce, l1, conf) -> the divergence message (a host read: only once training has diverged)."""
    loss, ce, l1, conf = vals.tolist()
    return f"non-finite training loss {loss} (ce {ce:.4g}, l1 {l1:.4g}, conf {conf:.4g})"


def full_drafter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The drafter's full (unsharded) weights on the CPU from a DSparkModule, bare or wrapped (FSDP, DDP).

    In a process group it is a collective (torch.distributed.checkpoint ``get_model_state_dict`` with
    ``full_state_dict`` and ``cpu_offload``): FSDP shards are all-gathered, rank 0 receives the tensors and the
    other ranks ``{}``, so no rank holds more than one full copy, and that copy in CPU memory."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    else:
        full = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    return {k.removeprefix("drafter."): v for k, v in full.items() if k.startswith("drafter.")}


def _part(kind: str, spec, *args):
    """A recipe part: a callable (class_path + init_args) or a registered name."""
    if spec is None or isinstance(spec, str):
        return build_part(kind, spec, *args)
    return spec(*args)


class DSparkModule(L.LightningModule):
    """A drafter composed from injected parts, trained against a frozen target.

    Args:
        backbone: builds the backbone from the target geometry (recipe: class_path + init_args), or a
            registered name (``dense``, ``moe_swa``, a plugin's) with default arguments.
        seq_head: builds the sequential head, or a registered name (null = none, e.g. the DFlash baseline).
        conf_head: builds the confidence head from (geometry, token_dim), or a registered name (null = none).
        block_size: γ, drafts per block.
        target: embedded target name or HF model path (linked from ``data.target``).
        layer_ids: tapped target layers (linked from ``data.layer_ids``; null = the SPEC §3.2 rule).
        system_prompt: chat format system prompt (linked from ``data.system_prompt``).
        target_dtype: the frozen target's dtype (linked from ``data.target_dtype``; null = bf16 when CUDA is
            available, else fp32). Under a ``*-true`` precision it must be that precision's dtype, since the drafter
            shares the target's embedding and LM head.
        mask_token_id: token id for mask slots (null = the target's default unused special token).
        drafter: a registered drafter built whole instead of from parts: a name (``eagle3``, ``mtp1``) or
            ``{name: ..., <its arguments>}``; ``block_size`` is passed to it.
        draft_vocab_size: reduced draft vocabulary (FR-Spec): the drafter's LM head, sequential-head output and
            sampling law cover the N most frequent target tokens of the training responses (stop tokens always
            included), chosen when training starts; null = the whole target vocabulary. Lossless either way.
        loss: loss weights and position decay.
        optim: optimizer and schedule.
        curriculum: training phases (block length, anchors per sequence, position decay) over training progress,
            e.g. a slot-1-first curriculum ``[{until: 0.7, block_size: 3, anchors: 96, decay: 1.5}, {until: 1.0}]``;
            validation and the export always use ``block_size``. null = one phase.
        warm_start: initialise the backbone from the target's layers (``drafters/warm_start.py``); null = SPEC
            §3.1's random initialisation.
    """

    def __init__(
        self,
        backbone: Callable[[TargetGeometry], nn.Module] | str | None = None,
        seq_head: Callable[[TargetGeometry], nn.Module] | str | None = None,
        conf_head: Callable[[TargetGeometry, int], nn.Module] | str | None = None,
        block_size: int = 7,
        target: str = "tiny-debug",
        layer_ids: list[int] | None = None,
        system_prompt: str | None = None,
        mask_token_id: int | None = None,
        loss: LossConfig | None = None,
        optim: OptimConfig | None = None,
        drafter: str | dict | None = None,
        draft_vocab_size: int | None = None,
        target_dtype: str | None = None,
        curriculum: list[Phase] | None = None,
        warm_start: WarmStart | None = None,
    ) -> None:
        super().__init__()
        self.loss_cfg = loss or LossConfig()
        self.optim_cfg = optim or OptimConfig()
        check_hparams(self.loss_cfg, self.optim_cfg, block_size)
        self.curriculum = [p if isinstance(p, Phase) else Phase(**p) for p in curriculum or []]
        check_curriculum(self.curriculum, block_size)
        chat = ChatFormat(system_prompt=system_prompt)
        tgt = load_target(target, layer_ids=layer_ids, chat=chat, dtype=resolve_dtype(target_dtype, "auto"))
        self.__dict__["_target"] = tgt  # not a sub-module: never trained, saved or wrapped by DDP
        g = draft_geometry(tgt, draft_vocab_size)
        if drafter is not None:  # one registered drafter (eagle3, mtp1, a plugin's) instead of parts
            if backbone is not None or seq_head is not None or conf_head is not None:
                raise ValueError("give either model.drafter or model.backbone/seq_head/conf_head, not both")
            spec = {"name": drafter} if isinstance(drafter, str) else dict(drafter)
            name = spec.pop("name")
            kwargs = spec.pop("args", spec)
            if draft_vocab_size is not None:
                kwargs["draft_vocab_size"] = draft_vocab_size
            self.drafter = create("drafter", name, tgt, block_size=block_size, **kwargs)
        else:
            if backbone is None:
                raise ValueError("model.backbone is required (or name a registered model.drafter)")
            sh = _part("seq_head", seq_head, g)
            ch = _part("conf_head", conf_head, g, getattr(sh, "token_dim", 0))
            bb = _part("backbone", backbone, g)
            self.drafter = compose(tgt, bb, sh, ch, block_size, mask_token_id, draft_vocab_size)
        if warm_start is not None:
            ws = warm_start if isinstance(warm_start, WarmStart) else WarmStart(**warm_start)
            copied = warm_start_fn(self.drafter, tgt, ws)
            print(f"[dspark-lightning] warm start: drafter layers from target layers {copied}", flush=True)
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
        """Check the precision against the target's dtype; pick the reduced draft vocabulary from the training
        responses (a resumed checkpoint restores the same)."""
        self._check_precision()
        self._check_curriculum_anchors()
        d = self.drafter
        if getattr(d, "draft_vocab", None) is None or d.vocab_ready:
            return
        dm = self.trainer.datamodule
        if not hasattr(dm, "token_counts"):
            raise ValueError("model.draft_vocab_size needs a datamodule with token_counts() (the DSpark datamodule)")
        counts = dm.token_counts("train")
        ids = frequent_tokens(counts, d.draft_vocab.numel(), always=self.target.stop_token_ids)
        d.set_draft_vocab(ids)
        held = dm.token_counts("heldout")
        print(
            f"[dspark-lightning] draft vocabulary: {ids.numel()} of {counts.numel()} tokens, covering "
            f"{100 * coverage(counts, ids):.2f}% of training and {100 * coverage(held, ids):.2f}% of held-out "
            "response tokens",
            flush=True,
        )

    def _check_curriculum_anchors(self) -> None:
        """A phase can only keep fewer anchors than the loader samples (``data.max_anchors``)."""
        have = getattr(getattr(self.trainer, "datamodule", None), "max_anchors", None)
        for i, ph in enumerate(self.curriculum):
            if have is not None and ph.anchors is not None and ph.anchors > have:
                raise ValueError(
                    f"model.curriculum[{i}].anchors is {ph.anchors} but data.max_anchors samples only {have} per "
                    "sequence: raise data.max_anchors to the largest phase's anchors"
                )

    def _check_precision(self) -> None:
        """A ``*-true`` precision casts the drafter's weights, not the target's (not a sub-module), yet the drafter
        computes with the target's embedding: their dtypes must agree (mixed precision autocasts and takes any)."""
        precision = str(self.trainer.precision)
        want, have = TRUE_PRECISIONS.get(precision), self.target.lm_head.weight.dtype
        if want is not None and want != have:
            raise ValueError(
                f"trainer.precision {precision} runs the drafter in {want} but the target (whose embedding and LM "
                f"head the drafter shares) is {have}: set data.target_dtype to match, or use a *-mixed precision"
            )

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
        if budget is not None and hasattr(self, "_fit_t0"):
            p = max(p, (time.perf_counter() - self._fit_t0) / budget)
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
        self._fit_t0, self._fit_tokens, self._fit_rows, self._fit_anchors = time.perf_counter(), 0, 0, 0
        self._pending_loss = None

    def on_train_end(self) -> None:
        """Write fit_stats.json (wall time, throughput, peak RSS, the last validation) next to the logs."""
        log_dir = self.trainer.log_dir  # a collective under DDP: every rank must call it
        if not self.trainer.is_global_zero or not hasattr(self, "_fit_t0"):
            return
        wall = time.perf_counter() - self._fit_t0
        tokens, rows, anchors = (int(x) for x in (self._fit_tokens, self._fit_rows, self._fit_anchors))  # one read each
        self._fit_stats = {
            "steps": int(self.global_step),
            "wall_s": wall,
            "tokens": tokens,
            "tokens_per_s": tokens / wall if wall > 0 else 0.0,
            "block_rows_per_s": rows / wall if wall > 0 else 0.0,
            "anchors_seen": anchors,
            "block_rows_seen": rows,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
        self._fit_stats_path = Path(log_dir or ".") / "fit_stats.json"
        self.report_validation()

    @property
    def validation_is_stale(self) -> bool:
        """True when training went on after the last validation (a run stopped by ``trainer.max_time``)."""
        return getattr(self, "_val_step", None) != int(self.global_step)

    def report_validation(self) -> None:
        """(Re)write fit_stats.json with the last validation and print its table (the CLI calls it again after a
        final validation of a run that stopped between validations)."""
        path = getattr(self, "_fit_stats_path", None)
        if path is None:
            return
        stats = {**self._fit_stats, "validation_step": getattr(self, "_val_step", None),
                 "validation": self.last_validation}  # fmt: skip
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(stats, indent=2) + "\n")  # rewritten after a final validation: never torn
        table = self.validation_table()
        if table and not self.validation_is_stale:
            print(f"[dspark-lightning] validation at step {self._val_step} (teacher-forced):\n{table}", flush=True)

    def on_train_epoch_start(self) -> None:
        dm = getattr(self.trainer, "datamodule", None)
        if hasattr(dm, "set_epoch"):
            dm.set_epoch(self.current_epoch)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        """No host read (the fused loss, the logged tensors and the fit counters stay on the device): the divergence
        guard reads once per optimizer step, in :meth:`on_before_optimizer_step`."""
        terms, v, B = self._step(batch)
        self._log_terms("train", terms, v, B)
        # this rank's tokens, supervised block rows (a curriculum phase trains fewer) and anchors: device tensors,
        # read once at the end of fit (fit_stats.json)
        self._fit_tokens = self._fit_tokens + batch["attention_mask"].sum()
        self._fit_rows = self._fit_rows + v.detach().sum()
        self._fit_anchors = self._fit_anchors + self._step_anchors
        loss = terms.total + self._moe_terms(B)
        self._watch_loss(loss, terms)
        return loss

    # --- divergence ----------------------------------------------------------------------------
    def _scaled(self) -> bool:
        """A loss scaler (``16-mixed``) expects overflow steps and skips them itself: no gradient check then."""
        return getattr(self.trainer.precision_plugin, "scaler", None) is not None

    def _watch_loss(self, loss: torch.Tensor, terms) -> None:
        """The loss half of the divergence guard, without a host read: whether a loss since the last optimizer step
        was non-finite, and the terms of the first such step, are kept on the device and read together with the
        gradient check before the optimizer step (one read per optimizer step instead of one per micro-batch; a
        non-finite loss gives non-finite gradients, which never reach the weights either way). Under a loss scaler,
        which has no gradient check, the loss is read here, once per step."""
        vals = torch.stack([loss.detach().float(), *(t.detach().float() for t in (terms.ce, terms.l1, terms.conf))])
        bad = ~vals[0].isfinite()
        if self._scaled():
            self._stop_if(bad, lambda: _loss_text(vals))
            return
        pending = getattr(self, "_pending_loss", None)
        if pending is not None:  # keep the values of the first non-finite micro-batch
            bad, vals = pending[0] | bad, torch.where(pending[0], pending[1], vals)
        self._pending_loss = (bad, vals)

    def on_before_optimizer_step(self, optimizer) -> None:
        """Stop before a non-finite loss or gradient reaches the weights (gradients unclipped, unscaled): one host read
        for both, after one all-reduce across ranks. Skipped under a loss scaler (``16-mixed``), whose overflow steps
        are expected: the scaler skips them itself (the loss is checked in the training step then)."""
        if self._scaled():
            return
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        local = [g.to_local() if hasattr(g, "to_local") else g for g in grads]  # DTensor shards (FSDP2)
        norms = [torch.linalg.vector_norm(g, dtype=torch.float32) for g in local if g.numel()]
        pending, self._pending_loss = getattr(self, "_pending_loss", None), None
        flags = torch.zeros(2, device=self.device)
        if pending is not None:
            flags[0] = pending[0].to(flags.device)
        if norms:
            flags[1] = (~torch.stack(norms).isfinite().all()).to(flags.device)
        loss_bad, grad_bad = self._any_rank(flags)
        if loss_bad:
            self._diverged(
                _loss_text(pending[1]) if pending is not None else "non-finite training loss on another rank"
            )
        if grad_bad:
            self._diverged("non-finite gradient")

    def _any_rank(self, flags: torch.Tensor) -> list[bool]:
        """``flags`` (n,) summed over the ranks on the device, then read on the host: the one host read of a check."""
        return (self.trainer.strategy.reduce(flags.float(), reduce_op="sum") > 0).tolist()

    def _stop_if(self, bad: torch.Tensor, what: Callable[[], str]) -> None:
        """Raise :class:`TrainingDiverged` on every rank when any rank saw ``bad`` (a 0-d bool tensor)."""
        if self._any_rank(bad.reshape(1))[0]:
            self._diverged(what())

    def _diverged(self, what: str) -> None:
        """Every rank raises together (none is left in a collective). Stopping, rather than skipping steps, keeps the
        weights and the checkpoints written so far finite."""
        raise TrainingDiverged(
            f"{what} at step {self.global_step}: training diverged and was stopped (nothing exported); "
            "lower model.optim.lr or check model.loss and the data, then resume from an earlier checkpoint "
            "with --ckpt_path or start again"
        )

    def _moe_terms(self, B: int) -> torch.Tensor | float:
        """MoE backbones: log each layer's expert load (max load x E: 1 = balanced) and add the weighted aux loss."""
        bb = getattr(self.drafter, "backbone", None)
        if bb is None:
            return 0.0
        for i, load in enumerate(moe_loads(bb)):
            self.log(f"moe/imbalance_layer{i}", load.max() * load.numel(), on_step=True, batch_size=B)
            for e, f in enumerate(load):
                self.log(f"moe/load_layer{i}_expert{e}", f, on_step=True, batch_size=B)
        aux = moe_aux_loss(bb)
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
        """The last validation as a small text table: per domain c*_1..k, TF-A_1..k, τ̂ and the greedy τ̂."""
        if not self.last_validation:
            return ""
        k = min(slots, self.block_size)
        head = ["domain", *[f"c*_{i + 1}" for i in range(k)], *[f"TF-A_{i + 1}" for i in range(k)], "τ̂", "τ̂(T=0)"]
        lines = ["  ".join(f"{h:>7}" for h in head)]
        for dom, row in self.last_validation.items():
            acc, tfa = row.get("acc_pos", []), row.get("tfa_pos", [])
            vals = [f"{x:7.3f}" for x in acc[:k]] + [f"{x:7.3f}" for x in tfa[:k]]
            vals += [f"{row.get('tau_hat', float('nan')):7.3f}", f"{row.get('tau_greedy', float('nan')):7.3f}"]
            lines.append("  ".join([f"{dom:>7}", *vals]))
        return "\n".join(lines)

    def on_validation_epoch_end(self) -> None:
        self._log_acceptance("val")

    def on_test_epoch_end(self) -> None:
        self._log_acceptance("test")

    # --- optimisation ------------------------------------------------------------------------
    def configure_optimizers(self):
        o = self.optim_cfg
        params = [p for p in self.drafter.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay)
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warm = max(1, int(o.warmup_fraction * total)) if o.time_budget_s is None else 0

        def factor(step: int) -> float:
            if o.time_budget_s is None:  # step-based, as SPEC §4: warmup over `warm` steps, then the schedule
                if step < warm:
                    return (step + 1) / warm
                return lr_factor((step - warm) / max(1, total - warm), 0.0, o.schedule, o.decay_fraction)
            return lr_factor(self.progress(), o.warmup_fraction, o.schedule, o.decay_fraction)

        sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
