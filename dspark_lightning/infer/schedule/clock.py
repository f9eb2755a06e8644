"""Round timings that mean the same on an accelerator as on the CPU, without synchronising to read them.

On CUDA a kernel launch returns before the kernel runs, so a host clock read after ``propose()`` measures the
launches, not the drafting, and the drafting cost that the hardware-aware scheduler and the draft gate weigh would
be far too low. :class:`RoundClock` marks intervals with CUDA events on the device's own timeline and reads them
only once they are complete, which is after the round's own synchronisations (the confidences and the acceptance
results are read on the host every round): no extra synchronisation. On a CPU a mark is ``time.perf_counter()``
and every interval is known at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


class RoundClock:
    """``a = clock.mark(); ...; clock.span(a, clock.mark(), then=fn)``: ``fn(seconds)`` runs once the work
    between the marks has finished on the device (immediately on a CPU); :meth:`settle` runs what is ready."""

    def __init__(self, device: torch.device) -> None:
        self.events = torch.device(device).type == "cuda" and torch.cuda.is_available()
        self._pending: list[tuple[object, object, Callable[[float], None]]] = []

    def mark(self):
        if not self.events:
            return time.perf_counter()
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def span(self, start, end, then: Callable[[float], None]) -> None:
        if not self.events:
            then(end - start)
            return
        self._pending.append((start, end, then))
        self.settle()

    def settle(self, wait: bool = False) -> None:
        """Hand over every finished interval (``wait``: synchronise first and hand over all, e.g. at the end)."""
        keep = []
        for start, end, then in self._pending:
            if wait:
                end.synchronize()
            if end.query():
                then(start.elapsed_time(end) / 1e3)
            else:
                keep.append((start, end, then))
        self._pending = keep
