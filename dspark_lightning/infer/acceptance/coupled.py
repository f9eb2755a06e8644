"""Coupled acceptance (``decode(..., acceptance="coupled")``): drafter and target share one Gumbel noise.

Every token at absolute position t of request r is argmax_v(log p_t(v) + g_r,t(v)) with g_r,t(v) standard Gumbel
noise that is a hash of (r's key, t, v). Drafted tokens use the same rule on the draft law, x_k =
argmax_v(log q_k(v) + g_r,P+k(v)); a draft is accepted while it equals the target's own choice at its position, and
the first mismatch (or the bonus) emits the target's choice there. So every emitted token is the one plain
decoding in this mode emits with the same seed, token for token, whatever the drafter, the scheduler, the batch
or the load: the output is drafter-invariant, and each position is an exact sample of the target law (the
Gumbel-max trick with fresh noise per position). A draft is accepted with probability at least
(1 - TV) / (1 + TV) of the 1 - TV that rejection sampling reaches (Daliri, Musco, Suresh 2024), so it trades some
acceptance for determinism. Rejection sampling stays the default.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch

from ...registry import register
from .accept import Acceptance, RejectionAcceptance
from .sampling import M32, SamplingParams, _hash32, sample

if TYPE_CHECKING:
    from ..request import Request

TOKEN_SALT = 0x27D4EB2F


class CoupledNoise:
    """Per-request Gumbel noise over token ids at absolute positions ``base[r] + offset`` (host ints).

    ``vocab``: target token ids of the columns of the laws this object draws for (a reduced draft vocabulary), so
    a draft-vocabulary index reads the noise of the target token it stands for.
    """

    def __init__(self, keys: list[int], base: list[int], device, vocab: torch.Tensor | None = None) -> None:
        k = torch.tensor([[key & M32, (key >> 32) & M32] for key in keys], dtype=torch.long).reshape(-1, 2)
        self.k = _hash32(k).to(device, non_blocking=True)  # (R, 2)
        self.base = torch.tensor(base, dtype=torch.long).to(device, non_blocking=True)
        self.vocab = vocab
        self.device = device
        self.cursor = 0  # successive sample() calls draw for successive positions

    def __len__(self) -> int:
        return self.base.shape[0]

    def gumbel(self, offsets: torch.Tensor, V: int) -> torch.Tensor:
        """(R, W, V) standard Gumbel noise at positions base + offsets (W,), for V law columns."""
        ids = self.vocab if self.vocab is not None and self.vocab.numel() == V else torch.arange(V, device=self.device)
        pos = (self.base[:, None] + offsets.to(self.base.device)) & M32  # (R, W)
        lo, hi = self.k[:, :1, None], self.k[:, 1:, None]
        h = _hash32(_hash32(_hash32(ids.long() ^ TOKEN_SALT) ^ _hash32(pos)[..., None] ^ lo) ^ hi)
        u = ((h >> 8).float() + 0.5) * 2.0**-24  # (0, 1), never 0 or 1
        return -torch.log(-torch.log(u))

    def argmax(self, law: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """argmax_v(log law(v) + g(v)) per row and position: law (R, W, V) -> (R, W) column indices."""
        return (law.clamp_min(0).log() + self.gumbel(offsets, law.shape[-1])).argmax(-1)

    def coupled_draw(self, law: torch.Tensor) -> torch.Tensor:
        """The coupled draw for (R, V) laws at the next position (:func:`~.sampling.sample`'s entry point)."""
        off = torch.tensor([self.cursor]).to(self.device, non_blocking=True)
        self.cursor += 1
        return self.argmax(law[:, None], off)[:, 0]


def accept_coupled(drafts: torch.Tensor, p: torch.Tensor, lengths: torch.Tensor, noise: CoupledNoise):
    """Accept drafts x_1..x_l while x_k is the target's coupled choice at P + k; emit the target's choice at the
    first unaccepted position. ``p`` (R, W, V) target laws at P+1..P+W; ``noise`` based at P + 1."""
    R, g = drafts.shape
    W = p.shape[1]
    choice = noise.argmax(p, torch.arange(W, device=p.device))  # (R, W) the target's token at P+1..P+W
    k = min(g, W - 1)
    lengths = lengths.to(drafts.device, non_blocking=True)
    in_block = torch.arange(k, device=drafts.device) < lengths[:, None]
    ok = (drafts[:, :k] == choice[:, :k]) & in_block
    m = ok.long().cumprod(-1).sum(-1)
    return Acceptance(m, choice[torch.arange(R, device=p.device), m])


@register("acceptance", "coupled")
def coupled(params: SamplingParams, device: torch.device, proposer=None) -> CoupledAcceptance | RejectionAcceptance:
    """Drafter and target read one Gumbel noise; greedy decoding is drafter-invariant already and accepts by
    rejection. A reduced draft vocabulary's target ids come from the proposer."""
    if params.greedy:
        return RejectionAcceptance(params, device)
    return CoupledAcceptance(params, device, getattr(proposer, "draft_vocab", None))


class CoupledAcceptance:
    """Coupled acceptance as an :class:`~.protocols.AcceptanceMode`: the noise of request r at position t is keyed by
    (r's acceptance key, t), and the drafter reads the same noise as the target (through ``draft_vocab``, the target
    ids of a reduced draft vocabulary's columns)."""

    def __init__(self, params: SamplingParams, device: torch.device, draft_vocab: torch.Tensor | None = None) -> None:
        self.params, self.device, self.draft_vocab = params, device, draft_vocab

    def first_tokens(self, requests: list[Request], laws: torch.Tensor) -> torch.Tensor:
        """The first generated token sits at position len(prompt)."""
        return sample(laws, self.params, self._noise(requests, [len(r.prompt) for r in requests]))

    @contextmanager
    def drafting(self, requests: list[Request]) -> Iterator[CoupledNoise]:
        """x_k at P + k from the noise the target will use there."""
        yield self._noise(requests, vocab=self.draft_vocab)

    def accept(self, requests: list[Request], drafts: torch.Tensor, q: torch.Tensor, p: torch.Tensor,
               lengths: torch.Tensor) -> Acceptance:  # fmt: skip
        return accept_coupled(drafts, p, lengths, self._noise(requests))

    def _noise(self, requests: list[Request], base: list[int] | None = None, vocab=None) -> CoupledNoise:
        """The noise of ``requests`` from position ``base`` (default: after each anchor)."""
        base = [r.pos + 1 for r in requests] if base is None else base
        return CoupledNoise([r.key for r in requests], base, self.device, vocab=vocab)
