"""The drafter's cost per round (:class:`DraftCost`), as the hardware-aware schedulers read it.

The hardware-aware schedulers and the draft gate weigh the drafting time of a step against the target's step
time. Reading this run's wall clock there would make ℓ (and with it how many random numbers acceptance draws)
depend on the machine's load, so the same seed would give different T > 0 output from run to run. So the cost per
round is profiled once per (drafter, target, machine), at the batch sizes the call can reach, and cached next to the
SPS table (:mod:`dspark_lightning.infer.profiling.measure_draft_cost`); ``decode()``'s setup reads it and hands it to
the scheduler, and every later call reads the same numbers. Live timing stays available as the schedulers' explicit
``timing="live"`` option (not reproducible).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def _in_batch(batches: list[int], values: list[float], R: float) -> float:
    """Linear between profiled batch sizes, proportional to R beyond the largest."""
    b, s = batches, values
    if R <= b[0]:
        return s[0]
    for (b0, s0), (b1, s1) in zip(zip(b, s, strict=True), zip(b[1:], s[1:], strict=True), strict=False):
        if R <= b1:
            return s0 + (R - b0) / (b1 - b0) * (s1 - s0)
    return s[-1] * R / b[-1]


@dataclass
class DraftCost:
    """Seconds a drafted round costs beyond its verification (proposal, context-cache update, scheduling) at
    profiled batch sizes; and, when profiled, whole steps as the engine runs them: a plain step (``plain``) and a
    drafted step verifying ``widths[i]`` drafts per request (``drafted[b][i]``), per batch size ``batches[b]``."""

    batches: list[int]
    seconds: list[float]
    meta: dict[str, Any] = field(default_factory=dict)
    plain: list[float] | None = None
    widths: list[int] | None = None
    drafted: list[list[float]] | None = None

    def __call__(self, R: int) -> float:
        return _in_batch(self.batches, self.seconds, R)

    @property
    def has_steps(self) -> bool:
        return bool(self.plain and self.widths and self.drafted)

    def plain_seconds(self, R: int) -> float:
        """A plain step of R requests."""
        return _in_batch(self.batches, self.plain, R)

    def step_seconds(self, R: int, B: int) -> float:
        """A drafted step of R requests verifying B tokens in all (R anchors + B - R drafts): piecewise linear in the
        drafts per request k = (B - R) / R through the profiled widths, from k = 0 (drafting, nothing verified:
        the first width's step less one width's increment, at least a plain step) and with the last increment
        beyond the widest. The medians are taken as measured, also where verifying more costs less (a CPU's matrix
        kernels can run 4 rows faster than 3): the walk then verifies the wider block."""
        k = max(B - R, 0) / max(R, 1)
        per_batch = []
        for plain, row in zip(self.plain, self.drafted, strict=True):
            ks, ts = list(self.widths), list(row)
            if len(ks) > 1:
                t0 = max(plain, ts[0] - (ts[1] - ts[0]) / (ks[1] - ks[0]) * ks[0])
            else:
                t0 = plain
            ks, ts = [0, *ks], [t0, *ts]
            if k >= ks[-1]:
                slope = (ts[-1] - ts[-2]) / (ks[-1] - ks[-2])
                per_batch.append(ts[-1] + max(slope, 0.0) * (k - ks[-1]))
                continue
            for (k0, a), (k1, b) in zip(zip(ks, ts, strict=True), zip(ks[1:], ts[1:], strict=True), strict=False):
                if k <= k1:
                    per_batch.append(a + (k - k0) / (k1 - k0) * (b - a))
                    break
        return _in_batch(self.batches, per_batch, R)

    def to_dict(self) -> dict[str, Any]:
        d = {"batches": self.batches, "seconds": self.seconds, "meta": self.meta}
        if self.has_steps:
            d |= {"plain": self.plain, "widths": self.widths, "drafted": self.drafted}
        return d
