"""How busy the machine was while a profile was measured: the share of all CPUs' time that other processes used
(Linux's ``/proc/stat`` less this process's own CPU time; None where ``/proc/stat`` is missing).

A profile timed while another job ran describes that moment, not the machine: the SPS table and the drafter's cost
are cached only when others used less than :data:`BUSY_SHARE` of the CPUs, else they serve the process that measured
them and the next process measures them again.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

BUSY_SHARE = 0.25  # others' share of all CPUs' time above which a measurement is not kept
_STAT = Path("/proc/stat")


def _snapshot() -> tuple[float, float, float] | None:
    """(busy CPU seconds of all processes, elapsed CPU seconds of all CPUs, this process's CPU seconds)."""
    try:
        fields = [int(x) for x in _STAT.read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already inside user time
    tick = os.sysconf("SC_CLK_TCK")
    return (total - idle) / tick, total / tick, time.process_time()


class OtherLoad:
    """``with OtherLoad() as load: ...`` then ``load.share``: others' share of all CPUs' time during the block (0-1,
    None where it cannot be read)."""

    share: float | None = None

    def __enter__(self) -> OtherLoad:
        self._start = _snapshot()
        return self

    def __exit__(self, *exc) -> None:
        end = _snapshot()
        if self._start is None or end is None or end[1] <= self._start[1]:
            return
        busy, total, own = (b - a for a, b in zip(self._start, end, strict=True))
        self.share = min(max((busy - own) / total, 0.0), 1.0)


def too_busy(meta: dict, what: str, progress: bool = True) -> bool:
    """Whether a profile's ``meta["others_cpu_share"]`` says it was measured on a busy machine (printing one line when
    ``progress``), so it is not to be cached."""
    share = meta.get("others_cpu_share")
    if share is None or share < BUSY_SHARE:
        return False
    if progress:
        print(f"[dspark-lightning] other processes used {share:.0%} of the CPUs while {what} was measured: it serves "
              "this process and is not cached (measured again by the next; profile on a quiet machine)")  # fmt: skip
    return True
