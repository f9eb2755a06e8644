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


@dataclass
class DraftCost:
    """Seconds a drafted round costs beyond its verification (proposal, context-cache update, scheduling,
    acceptance) at profiled batch sizes."""

    batches: list[int]
    seconds: list[float]
    meta: dict[str, Any] = field(default_factory=dict)

    def __call__(self, R: int) -> float:
        """Linear between profiled batch sizes, proportional to R beyond the largest."""
        b, s = self.batches, self.seconds
        if R <= b[0]:
            return s[0]
        for (b0, s0), (b1, s1) in zip(zip(b, s, strict=True), zip(b[1:], s[1:], strict=True), strict=False):
            if R <= b1:
                return s0 + (R - b0) / (b1 - b0) * (s1 - s0)
        return s[-1] * R / b[-1]

    def to_dict(self) -> dict[str, Any]:
        return {"batches": self.batches, "seconds": self.seconds, "meta": self.meta}
