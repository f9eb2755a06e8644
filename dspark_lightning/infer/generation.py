"""The data pipeline's one door into the runtime (tests/unit/test_layering.py: ``SEAMS``).

``data/regenerate.py`` answers training prompts with the target alone: plain decoding, no drafter, with the
runtime's sampling law and continuous batching. It builds that engine here and drives it through the engine's own
``add`` / ``step`` / ``requests``; nothing else of ``infer/`` is imported by ``data/``.
"""

from __future__ import annotations

from typing import Any

from .engine import Engine
from .sampling import SamplingParams


def generation_engine(target: Any, temperature: float, top_k: int | None, top_p: float | None) -> Engine:
    """A draft-free :class:`~.engine.Engine` on ``target`` sampling at ``temperature`` (top-k, and top-p when
    ``temperature > 0``), stopping at the target's stop tokens."""
    params = SamplingParams(temperature, top_k, top_p if temperature > 0 else None)
    engine = Engine(target, None, params=params, stop_token_ids=target.stop_token_ids)
    # training text need not be bit-equal to HF's bf16 decoding: attention in fp32 where that is faster (lean.attention)
    engine.verifier.fp32_attention = True
    return engine
