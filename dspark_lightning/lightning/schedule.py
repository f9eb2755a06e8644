"""Training schedules: the learning-rate factor (cosine or warmup-stable-decay) and the curriculum phases.

Both read one *progress* p in [0, 1]: the share of ``trainer.max_steps`` done, or of ``optim.time_budget_s`` when
that is set (a fixed wall-clock budget, as the experiment matrix trains), whichever is further along.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..checks import UsageError

SCHEDULES = ("cosine", "wsd", "constant")


def lr_factor(progress: float, warmup: float, schedule: str = "cosine", decay_fraction: float = 0.2) -> float:
    """The LR multiplier at ``progress``: linear warmup over the first ``warmup`` share, then

    - ``cosine``: cosine to 0 at the end (docs/algorithm.md §4);
    - ``wsd``: constant, then a linear decay to 0 over the last ``decay_fraction`` (warmup-stable-decay: a run's
      stable-phase checkpoints can each be decayed to read the same run at several budgets);
    - ``constant``: constant after warmup.
    """
    p = min(max(progress, 0.0), 1.0)
    if warmup > 0 and p < warmup:
        return max(p / warmup, 1e-3)
    if schedule == "constant":
        return 1.0
    if schedule == "wsd":
        start = 1.0 - decay_fraction
        return 1.0 if p < start else max(0.0, (1.0 - p) / max(decay_fraction, 1e-12))
    return 0.5 * (1 + math.cos(math.pi * min(1.0, (p - warmup) / max(1e-12, 1 - warmup))))


@dataclass
class Phase:
    """One curriculum phase, active while progress < ``until`` (the last phase runs to the end).

    A slot-1-first curriculum trains short blocks with many anchors first, then the full block; the drafter always
    keeps (and exports) ``model.block_size`` slots."""

    until: float = 1.0
    """end of the phase as a share of training progress (0 < until <= 1)"""
    block_size: int | None = None
    """training block length (1..model.block_size; null = model.block_size)"""
    anchors: int | None = None
    """anchors per sequence (<= data.max_anchors, which the loader samples; null = all it sampled)"""
    decay: float | None = None
    """position-weight decay of this phase (null = model.loss.decay)"""


def check_curriculum(phases: list[Phase] | None, block_size: int) -> None:
    if not phases:
        return
    last = 0.0
    for i, ph in enumerate(phases):
        key = f"model.curriculum[{i}]"
        if not (isinstance(ph.until, int | float) and last < ph.until <= 1):
            raise UsageError(f"{key}.until must increase within (0, 1], got {ph.until}")
        last = ph.until
        if ph.block_size is not None and not (isinstance(ph.block_size, int) and 1 <= ph.block_size <= block_size):
            raise UsageError(f"{key}.block_size must be in [1, {block_size}] (model.block_size), got {ph.block_size}")
        if ph.anchors is not None and not (isinstance(ph.anchors, int) and ph.anchors >= 1):
            raise UsageError(f"{key}.anchors must be >= 1, got {ph.anchors}")
        if ph.decay is not None and not (math.isfinite(ph.decay) and ph.decay > 0):
            raise UsageError(f"{key}.decay must be finite and > 0 (null = model.loss.decay), got {ph.decay}")


def phase_at(phases: list[Phase] | None, progress: float) -> Phase | None:
    if not phases:
        return None
    return next((ph for ph in phases if progress < ph.until), phases[-1])


def subsample_anchors(
    anchors: torch.Tensor, valid: torch.Tensor, n: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep ``n`` of each row's anchors, uniformly among the valid ones (dummies only where too few are valid), in
    their sorted order: (B, A) -> (B, min(n, A))."""
    if n >= anchors.shape[1]:
        return anchors, valid
    score = torch.rand(anchors.shape, generator=generator).to(anchors.device)
    score = score.masked_fill(~valid, -1.0)
    keep = score.topk(n, dim=1).indices.sort(dim=1).values
    return anchors.gather(1, keep), valid.gather(1, keep)
