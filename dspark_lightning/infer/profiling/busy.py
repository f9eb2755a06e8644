"""How busy the machine was while a profile was measured: the share of the time of the CPUs this process may run on
that other processes used (Linux's ``/proc/stat`` less this process's own CPU time; None where it cannot be read).

A profile timed while another job ran describes that moment, not the machine: the SPS table, the drafter's cost and
the matrix-kernel choice are cached only when others used less than :data:`BUSY_SHARE` of the CPUs, else they serve
the process that measured them and the next process measures them again.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

BUSY_SHARE = 0.25  # others' share of the CPUs' time above which a measurement is not kept
_STAT = Path("/proc/stat")


def _snapshot() -> tuple[float, float, float] | None:
    """(busy seconds, elapsed seconds) summed over the CPUs this process may run on, and its own CPU seconds."""
    try:
        mine = {f"cpu{i}" for i in os.sched_getaffinity(0)}
        rows = [
            line.split()
            for line in _STAT.read_text().splitlines()
            if line.startswith("cpu") and line.split(maxsplit=1)[0] in mine
        ]
        fields = [sum(int(row[k]) for row in rows) for k in range(1, 9)]  # user .. steal (guest is inside user)
    except (OSError, ValueError, IndexError, AttributeError):  # AttributeError: no sched_getaffinity (macOS)
        return None
    tick = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields) - idle) / tick, sum(fields) / tick, time.process_time()


class OtherLoad:
    """``with OtherLoad() as load: ...`` then ``load.share``: others' share of the CPUs' time during the block (0-1,
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
