"""The data pipeline's one door into the runtime (tests/unit/test_layering.py: ``SEAMS``).

``data/regen/regenerate.py`` answers training prompts with the target alone: plain decoding, no drafter, with the
runtime's sampling law and continuous batching. It builds that engine here and drives it through the engine's own
``add`` / ``step`` / ``requests``; nothing else of ``infer/`` is imported by ``data/``.

With a :class:`FeatureTrace` the engine also keeps, per request, the target outputs a drafter is trained on (the
tapped layers' context and the last hidden state) of every position it runs: the prompt at prefill, then each
committed token. A response's features then cost no second forward (``data.regen.capture_features``).
"""

from __future__ import annotations

from typing import Any

import torch

from .acceptance.sampling import SamplingParams
from .engine import Engine


class FeatureTrace:
    """The target features of every position an engine has run, per request id, on the host.

    :meth:`extend` takes a forward's padded ``(R, W, ·)`` outputs and the number of valid leading positions of each
    row; :meth:`pop` returns a request's positions 0..n-1 concatenated (``context (n, taps*d)``, ``hidden (n, d)``)
    in the engine's dtype and forgets them."""

    def __init__(self) -> None:
        self._parts: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    def extend(self, ids: list[int], context: torch.Tensor, hidden: torch.Tensor, counts) -> None:
        context, hidden = context.detach().cpu(), hidden.detach().cpu()
        for i, (rid, n) in enumerate(zip(ids, torch.as_tensor(counts).tolist(), strict=True)):
            self._parts.setdefault(rid, []).append((context[i, :n], hidden[i, :n]))

    def pop(self, rid: int) -> tuple[torch.Tensor, torch.Tensor]:
        parts = self._parts.pop(rid)
        return torch.cat([c for c, _ in parts]), torch.cat([h for _, h in parts])

    def drop(self, rid: int) -> None:
        self._parts.pop(rid, None)

    def __len__(self) -> int:
        return len(self._parts)


def generation_engine(
    target: Any, temperature: float, top_k: int | None, top_p: float | None, trace: FeatureTrace | None = None
) -> Engine:
    """A draft-free :class:`~.engine.Engine` on ``target`` sampling at ``temperature`` (top-k, and top-p when
    ``temperature > 0``), stopping at the target's stop tokens; ``trace`` keeps the features it computes."""
    params = SamplingParams(temperature, top_k, top_p if temperature > 0 else None)
    engine = Engine(target, None, params=params, stop_token_ids=target.stop_token_ids)
    # training text need not be bit-equal to HF's bf16 decoding: attention in fp32 where that is faster (lean.attention)
    engine.verifier.fp32_attention = True
    engine.trace = trace
    return engine
