"""What the runtime knows about this machine: a :class:`HardwareProfile`, measured once and handed over as data.

The hardware-aware schedulers weigh a step's verification cost (the target's SPS table) and its drafting cost (the
drafter's cost per round); the lean verifier runs its products through this CPU's fastest kernels (the kernel
table). :mod:`dspark_lightning.infer.profiling.measure_hardware` measures (or reads from the cache) the parts a
scheduler asks for, before the decoding loop; the engine hands the profile to its scheduler
(:meth:`.schedulers.Scheduler.use_hardware`) and the kernel table to its verifier. Nothing in the decoding loop
measures the machine.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..checks import UsageError

if TYPE_CHECKING:
    from .schedule.draft_cost import DraftCost
    from .schedule.sps import SPSTable
    from .verify.kernels import KernelTable

PARTS = ("sps", "draft_cost", "kernels")


@dataclass(frozen=True)
class HardwareProfile:
    """This machine's measured costs; a part left None is not known (a scheduler that needs it says so)."""

    sps: SPSTable | None = None  # the target's verification steps per second by verified tokens B
    draft_cost: DraftCost | None = None  # the drafter's seconds per drafted round by batch size
    kernels: KernelTable | None = None  # the matrix kernel per weight shape and row count (CPU; None: the library's)
    padded: bool = False  # the engine verifies R rows of 1 + max ℓ positions (set by the engine, not measured)

    def with_parts(self, **parts) -> HardwareProfile:
        """A copy with some parts replaced (unknown names are refused)."""
        unknown = set(parts) - {*PARTS, "padded"}
        if unknown:
            raise UsageError(f"a HardwareProfile has no part {sorted(unknown)}; its parts are {', '.join(PARTS)}")
        return replace(self, **parts)
