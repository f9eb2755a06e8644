"""The bases of the proposers (:class:`~.protocols.Proposer`): what every drafter's runtime side does alike.

:class:`ProposerBase` is the base of a proposer with a per-request drafter context cache (the block proposer of
:mod:`.draft`, the chain proposer of :mod:`.chain`): the drafter and its draft LM head, the cache's per-request
bookkeeping (:class:`~.kvcache.RequestCache`: ``add`` and ``remove`` requests, writing committed positions and
compacting), and the mapping between a reduced draft vocabulary and target token ids
(:class:`~.protocols.ReducedVocabulary`). A subclass gives its cache layers to ``__init__`` and implements
``extend`` and ``propose``; per-request state kept beside the cache is dropped in :meth:`ProposerBase.forget`.
:class:`StatelessProposer` is the base of a proposer without a cache (n-gram lookups, test oracles).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..acceptance.sampling import SamplingParams
from ..verify.kvcache import RequestCache

if TYPE_CHECKING:
    from .draft import Proposal


def draft_confidence(q: torch.Tensor, z: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """ĉ of a drafter without a confidence head: its own top probability, known before x_k is drawn."""
    return (q if not params.greedy else z.float().softmax(-1)).max(-1).values


class ProposerBase(RequestCache):
    """A proposer over ``drafter`` whose context cache (:class:`~.kvcache.RaggedCache` ``kv`` of ``layers``, in the
    ``padded`` or ``flat`` batching) holds the committed positions of every request (see the module docstring).

    Attributes: ``drafter`` (eval mode), ``block_size`` γ, ``device`` and ``dtype`` (the drafter's: it may run in
    bf16, its laws are still fp32), ``head_w`` the draft LM head's weight (N or V, d), gathered once in the drafter
    dtype, and ``held`` (request id -> cached positions, on the host).
    """

    def __init__(self, drafter, layers: list, batching: str = "padded") -> None:
        self.drafter = drafter.eval()
        self.block_size = drafter.block_size
        p = next(drafter.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.head_w = drafter.draft_head_weight().to(self.dtype)
        self._open_cache(layers, batching)

    @property
    def draft_vocab(self) -> torch.Tensor | None:
        """Target token ids of the draft laws' columns (:class:`~.protocols.ReducedVocabulary`), None for all."""
        return self.drafter.draft_vocab

    def add(self, ids: list[int]) -> None:
        self.kv.add_requests(ids)
        self.held.update((i, 0) for i in ids)

    def remove(self, ids: list[int]) -> None:
        self._drop(ids)
        self.forget(ids)

    def forget(self, ids: list[int]) -> None:
        """Drop the per-request state a subclass keeps beside the cache (none here)."""

    def extend(self, ids: list[int], context: torch.Tensor, start: torch.Tensor, lengths: torch.Tensor, hidden=None):
        raise NotImplementedError

    def propose(self, ids, anchors, anchor_pos, params, generator=None, teacher_tokens=None, requests=None) -> Proposal:
        raise NotImplementedError

    def _commit(self, kv, owner: torch.Tensor, pos: torch.Tensor) -> None:
        """Write committed columns into the cache: each layer's new keys and values (rows, H, L, Dh) in ``kv``,
        their owners and positions (rows, L); then compact (``held`` already counts them)."""
        for layer, (k, v) in zip(self.kv.layers, kv, strict=True):
            layer.update(k, v)
        self.kv.append(owner, pos)
        self._compact()

    def _target_ids(self, x: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary indices -> target token ids (unchanged without a reduced vocabulary)."""
        vocab = self.draft_vocab
        return x if vocab is None else vocab[x]

    def _target_laws(self, q: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Laws and logits over a reduced draft vocabulary (…, N) -> the target vocabulary (…, V): q exactly 0 and
        z = -inf outside the subset (unchanged without a reduced vocabulary)."""
        vocab = self.draft_vocab
        if vocab is None:
            return q, z
        full_q = q.new_zeros((*q.shape[:-1], self.drafter.embed.num_embeddings)).index_copy_(-1, vocab, q)
        return full_q, self.drafter.full_logits(z)


class StatelessProposer:
    """Base for proposers that keep no per-request cache (n-gram lookups, test oracles): only ``propose`` remains."""

    block_size: int

    def add(self, ids: list[int]) -> None:
        pass

    def remove(self, ids: list[int]) -> None:
        pass

    def extend(self, ids: list[int], context: torch.Tensor, start: torch.Tensor, lengths: torch.Tensor, hidden=None):
        pass

    def propose(self, ids, anchors, anchor_pos, params, generator=None, requests=None) -> Proposal:
        raise NotImplementedError
