"""The interfaces the decoding engine drives: every method and attribute it (and ``decode()``) uses on each part.

A round (:meth:`~.engine.Engine.step`) goes gate -> draft -> schedule -> verify -> accept -> commit:

- a :class:`Proposer` drafts a block per request (:class:`~.draft.Proposal`);
- a :class:`Scheduler` picks each request's verification length from the confidences alone;
- a :class:`Verifier` runs the target over every request's [anchor + admitted drafts] (:class:`SegmentOutput`);
- an :class:`AcceptanceMode` draws the randomness of drafting and acceptance and accepts a prefix of each block.

A scheduler may also take part in the round through optional hooks, each its own protocol, checked once with
``isinstance`` (they are ``runtime_checkable``): :class:`Resettable`, :class:`DraftGated` (skip the drafter for a
whole step), :class:`StepObserver` and :class:`DraftTimeObserver` (the step's outcome and drafting time), and
:class:`SPSDriven` (``decode()``'s setup hands it the SPS table and the drafter's profiled cost per round).
:class:`AdaptiveScheduler` is all of them together: what the built-in hardware-aware schedulers are. A proposer
whose laws cover a reduced draft vocabulary says which target tokens it covers (:class:`ReducedVocabulary`).
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
    from .schedule.draft_cost import DraftCost


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


# --- the scheduler ------------------------------------------------------------------------------------------------
@runtime_checkable
class Scheduler(Protocol):
    def __call__(self, conf: torch.Tensor) -> torch.Tensor:
        """ĉ (R, γ) in [0, 1] -> l (R,) long in [0, γ], on the host."""
        ...


@runtime_checkable
class Resettable(Protocol):
    def reset(self) -> None:
        """Forget the state of an earlier run (an engine calls it once, when it takes the scheduler)."""
        ...


@runtime_checkable
class DraftGated(Protocol):
    def wants_draft(self, R: int) -> bool:
        """Whether to run the drafter this step, from earlier steps only (False: l = 0 for every request)."""
        ...


@runtime_checkable
class StepObserver(Protocol):
    def observe_step(self, drafted: bool, R: int, tokens: int, seconds: float, verified: int | None = None) -> None:
        """A finished step: drafted or not, R requests, ``tokens`` committed, its time, ``verified`` tokens B."""
        ...


@runtime_checkable
class DraftTimeObserver(Protocol):
    def observe_draft_time(self, seconds: float) -> None:
        """A drafted step's drafting time (with the drafter's last cache update)."""
        ...


@runtime_checkable
class SPSDriven(Protocol):
    """A scheduler that reads the target's SPS table and, with model timing, the drafter's cost per round."""

    @property
    def needs_draft_cost(self) -> bool:
        """Whether its model of a step's time takes the drafter's profiled cost per round (:meth:`use_draft_cost`)."""
        ...

    def bind(self, target: Any, max_tokens: int | None = None, progress: bool = True) -> None:
        """Load (or profile once and cache) the target's SPS table on this machine when none was given."""
        ...

    def use_draft_cost(self, cost: DraftCost) -> None:
        """The drafter's profiled cost per round (see :mod:`dspark_lightning.profiling.draft_cost`)."""
        ...


@runtime_checkable
class AdaptiveScheduler(
    Scheduler, Resettable, DraftGated, StepObserver, DraftTimeObserver, SPSDriven, Protocol
):  # fmt: skip
    """Every hook together: the hardware-aware schedulers."""


SCHEDULER_HOOKS = (Resettable, DraftGated, StepObserver, DraftTimeObserver, SPSDriven)


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


def members(protocol: type) -> set[str]:
    """The names a protocol declares (methods, properties and attributes), its bases' included."""
    out: set[str] = set()
    for cls in protocol.__mro__:
        if cls in (Protocol, object, Any) or not getattr(cls, "_is_protocol", False):
            continue
        out |= {n for n in vars(cls) if not n.startswith("_") or n == "__call__"}
        out |= set(getattr(cls, "__annotations__", {}))
    return out
