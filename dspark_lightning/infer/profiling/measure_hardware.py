"""This machine's :class:`~..hardware.HardwareProfile` for an engine: the parts its scheduler lacks, read from the
cache or measured once (the target's SPS table, the drafter's cost per round), with the kernel table its verifier
chose. ``decode()`` and the serving benchmark call :func:`measure_hardware` before their loops and hand the result to
the engine (:meth:`~..engine.Engine.use_hardware`)."""

from __future__ import annotations

from ..hardware import HardwareProfile
from .measure_draft_cost import load_or_profile_draft_cost
from .measure_sps import load_or_profile

MAX_SPS_TOKENS = 256  # the largest B an SPS table is profiled to for a decode (the default grid's end)


def measure_hardware(engine, target, drafter, max_requests: int, progress: bool = True) -> HardwareProfile:
    """``engine.hardware`` completed with what its scheduler still needs for up to ``max_requests`` requests (nothing
    when the engine has no drafter: every round is plain)."""
    profile = engine.hardware
    need = engine.scheduler.needs_hardware() if engine.proposer is not None else frozenset()
    parts = {}
    if "sps" in need and profile.sps is None:
        # at the scheduler's own context length when it has one (the SPS-driven schedulers' ``context_len``)
        context_len = getattr(engine.scheduler, "context_len", 512)
        max_tokens = min(max_requests * (engine.block_size + 1), MAX_SPS_TOKENS)
        parts["sps"] = load_or_profile(target, context_len, max_tokens=max_tokens, progress=progress)
    if "draft_cost" in need and profile.draft_cost is None and drafter is not None:
        parts["draft_cost"] = load_or_profile_draft_cost(
            target, drafter, max_requests, progress=progress, params=engine.params, acceptance=engine.acceptance_spec
        )
    return profile.with_parts(**parts) if parts else profile
