"""The interfaces the decoding engine drives: every method and attribute it (and ``decode()``) uses on each part.

A round (:meth:`~.engine.Engine.step`) goes gate -> draft -> schedule -> verify -> accept -> commit:

- a :class:`Proposer` drafts a block per request (:class:`~.draft.Proposal`);
- a scheduler picks each request's verification length from the confidences alone (a base class with hooks, not a
  protocol: :class:`~.schedulers.Scheduler`);
- a :class:`Verifier` runs the target over every request's [anchor + admitted drafts] (:class:`SegmentOutput`);
- an :class:`AcceptanceMode` draws the randomness of drafting and acceptance and accepts a prefix of each block.

A proposer whose laws cover a reduced draft vocabulary says which target tokens it covers
(:class:`ReducedVocabulary`); a verifier that runs its products through a measured kernel table says which
(:class:`KernelChoice`; the engine keeps it in its :class:`~.hardware.HardwareProfile`).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from .acceptance.accept import Acceptance
    from .acceptance.sampling import Generators, SamplingParams
    from .propose.draft import Proposal
    from .request import Request
    from .verify.kernels import KernelTable


@dataclass
class SegmentOutput:
    """What a verifier's forward returns for each request's new tokens."""

    hidden: torch.Tensor  # (R, W, d) final-norm target hidden states of each request's tokens
    context: torch.Tensor  # (R, W, n*d) raw tapped-layer features (the drafter's context)


# --- the target side ----------------------------------------------------------------------------------------------
@runtime_checkable
class Verifier(Protocol):
    """The target's forward over a batch of requests, with a per-request KV cache that can roll back."""

    device: torch.device
    batching: str  # padded: a row per request, a forward computes R (1 + max ℓ) positions; flat: Σ (1 + ℓ_r)

    def prefill(self, ids: list[int], prompts: list[list[int]]) -> SegmentOutput:
        """Cache new requests' prompts; outputs padded to the longest prompt, in the order of ``ids``."""
        ...

    def forward(self, ids: list[int], tokens: torch.Tensor, lengths: Any, start: Any) -> SegmentOutput:
        """Tokens (R, W), valid up to ``lengths[r]``, at positions from ``start[r]`` (both host data)."""
        ...

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Target logits (..., V) of final hidden states, as the model's own head computes them."""
        ...

    def commit(self, ids: list[int], keep_pos: torch.Tensor) -> None:
        """Keep positions <= ``keep_pos[i]`` of request ``ids[i]`` (host data): drops rejected drafts."""
        ...

    def remove(self, ids: list[int]) -> None:
        """Free the caches of finished requests."""
        ...


@runtime_checkable
class KernelChoice(Protocol):
    """Optional for a verifier: the :class:`~.kernels.KernelTable` its products run through (None: the library's)."""

    kernels: KernelTable | None


# --- the drafter side ---------------------------------------------------------------------------------------------
@runtime_checkable
class Proposer(Protocol):
    """The runtime side of a drafter: a per-request context cache and a block of drafts per round."""

    block_size: int  # γ, drafts per block

    def add(self, ids: list[int]) -> None:
        """Start caches for new requests."""
        ...

    def remove(self, ids: list[int]) -> None:
        """Drop the caches of finished requests."""
        ...

    def extend(self, ids: list[int], context: torch.Tensor, start: torch.Tensor, lengths: torch.Tensor,
               hidden: torch.Tensor | None = None) -> None:  # fmt: skip
        """Append the target features (R, W, n·d) (and final hidden states (R, W, d)) of committed positions
        ``start[r]`` .. ``start[r] + lengths[r] - 1`` (host tensors)."""
        ...

    def propose(self, ids: list[int], anchors: torch.Tensor, anchor_pos: torch.Tensor, params: SamplingParams,
                generator: Generators = None, requests: list[Request] | None = None) -> Proposal:  # fmt: skip
        """A block of γ drafts after each anchor, sampled with ``generator`` (see :class:`AcceptanceMode`)."""
        ...


@runtime_checkable
class ReducedVocabulary(Protocol):
    """Optional for a proposer: the target token ids its draft laws' columns stand for (None: all of them)."""

    draft_vocab: torch.Tensor | None


# --- acceptance ---------------------------------------------------------------------------------------------------
@runtime_checkable
class AcceptanceMode(Protocol):
    """Where drafting and acceptance draw their randomness from, and how a block's prefix is accepted."""

    def first_tokens(self, requests: list[Request], laws: torch.Tensor) -> torch.Tensor:
        """The first generated token of each new request from the target's laws (R, V) after its prompt."""
        ...

    def drafting(self, requests: list[Request]) -> AbstractContextManager[Generators]:
        """``with mode.drafting(requests) as generator:`` the randomness the proposer samples its drafts with."""
        ...

    def accept(self, requests: list[Request], drafts: torch.Tensor, q: torch.Tensor, p: torch.Tensor,
               lengths: torch.Tensor) -> Acceptance:  # fmt: skip
        """Accepted drafts m and the next token y per request, from drafts (R, γ), their laws q (R, γ, V), the
        target laws p (R, W, V) and the verification lengths l (R,) on the host."""
        ...


class ModeConfidence(Protocol):
    """Optional for an acceptance mode that accepts less (or more) often than rejection sampling, which a drafter's
    confidences predict: ``confidence(conf)`` maps them (R, γ, host) to this mode's chances, which the scheduler then
    reads."""

    def confidence(self, conf: torch.Tensor) -> torch.Tensor: ...


def members(protocol: type) -> set[str]:
    """The names a protocol declares (methods, properties and attributes), its bases' included."""
    out: set[str] = set()
    for cls in protocol.__mro__:
        if cls in (Protocol, object, Any) or not getattr(cls, "_is_protocol", False):
            continue
        out |= {n for n in vars(cls) if not n.startswith("_") or n == "__call__"}
        out |= set(getattr(cls, "__annotations__", {}))
    return out
