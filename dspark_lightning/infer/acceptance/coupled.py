"""Coupled acceptance (``decode(..., acceptance="coupled")``): drafter and target share one Gumbel noise.

Every token at absolute position t of request r is argmax_v(log p_t(v) + g_r,t(v)) with g_r,t(v) standard Gumbel
noise keyed by (r's key, t, v) (:class:`CoupledNoise`). Drafted tokens use the same rule on the draft law, x_k =
argmax_v(log q_k(v) + g_r,P+k(v)); a draft is accepted while it equals the target's own choice at its position, and
the first mismatch (or the bonus) emits the target's choice there. So every emitted token is the one plain
decoding in this mode emits with the same seed, token for token, whatever the drafter, the scheduler, the batch
or the load: the output is drafter-invariant, and each position is an exact sample of the target law (the
Gumbel-max trick with fresh noise per position). A draft is accepted with probability at least
(1 - TV) / (1 + TV) of the 1 - TV that rejection sampling reaches (Daliri, Musco, Suresh 2024), so it trades some
acceptance for determinism. Rejection sampling stays the default.
"""

from __future__ import annotations

import functools
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


M64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    """splitmix64's finaliser: a 64-bit integer whose every bit depends on every bit of ``x``."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def row_seed(key: int, pos: int) -> int:
    """The seed of request ``key``'s noise row at absolute position ``pos``."""
    return _mix64(_mix64(key & M64) ^ (pos & M64))


@functools.lru_cache(maxsize=8)
def _token_hashes(V: int, device: torch.device) -> torch.Tensor:
    return _hash32(torch.arange(V, device=device) ^ TOKEN_SALT)


class CoupledNoise:
    """Per-request Gumbel noise over token ids at absolute positions ``base[r] + offset`` (host ints).

    On a CPU a position's row is a generator's uniforms seeded by (request key, position) (:func:`row_seed`): one
    seeding and V draws per row, token v reading the row's v-th value. On an accelerator it is a counter hash of
    (key, position, token) computed for every entry at once (one kernel, where a generator per row would launch one
    per row). Either way the noise of an entry depends on nothing else, so drafter and target read the same.

    ``vocab``: the target token ids of the columns of the laws this object draws for (a reduced draft vocabulary, so
    a draft-vocabulary index reads the noise of the target token it stands for); None for all of them.
    """

    def __init__(self, keys: list[int], base: list[int], device, vocab: torch.Tensor | None = None) -> None:
        self.keys, self.base_h = list(keys), list(base)
        self.device = torch.device(device)
        self.vocab = vocab
        self.cursor = 0  # successive sample() calls draw for successive positions

    def __len__(self) -> int:
        return len(self.base_h)

    def exponential(self, offsets: torch.Tensor, V: int) -> torch.Tensor:
        """(R, W, V) standard exponential noise E = -log u at positions base + offsets (W,), for V law columns (u in
        (0, 1) on a 2^-24 grid, never 0 or 1); the Gumbel noise of the Gumbel-max trick is -log E."""
        reduced = self.vocab is not None and self.vocab.numel() == V
        offs = [int(o) for o in offsets.tolist()]
        if self.device.type == "cpu":
            n = int(self.vocab.max()) + 1 if reduced else V  # a row's first n values (a generator's stream)
            u = torch.empty(len(self), len(offs), n)
            gen = torch.Generator()
            for r, (key, base) in enumerate(zip(self.keys, self.base_h, strict=True)):
                for j, off in enumerate(offs):
                    gen.manual_seed(row_seed(key, base + off))
                    torch.rand(n, generator=gen, out=u[r, j])
            u.add_(2.0**-25)  # k 2^-24 -> (k + 1/2) 2^-24
        else:
            ids = self.vocab.long() if reduced else None
            tok = _token_hashes(V, self.device) if ids is None else _hash32(ids ^ TOKEN_SALT)
            k = torch.tensor([[row_seed(key, base + off) for off in offs] for key, base in
                              zip(self.keys, self.base_h, strict=True)], dtype=torch.long)  # fmt: skip
            lo, hi = _hash32(k & M32).to(self.device), _hash32((k >> 32) & M32).to(self.device)
            h = _hash32(_hash32(tok ^ lo[..., None]) ^ hi[..., None])
            u = ((h >> 8).float() + 0.5) * 2.0**-24
            reduced = False  # the hash read the target ids already
        E = u.log_().neg_()
        return E[..., self.vocab.to(E.device)] if reduced else E

    def argmax(self, law: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """argmax_v(log law(v) + g(v)) per row and position, computed as argmax_v(law(v) / E(v)) (the same order,
        with one logarithm): law (R, W, V) -> (R, W) column indices."""
        E = self.exponential(offsets, law.shape[-1]).to(law.device)
        return (law.clamp_min(0) / E).argmax(-1)

    def coupled_draw(self, law: torch.Tensor) -> torch.Tensor:
        """The coupled draw for (R, V) laws at the next position (:func:`~.sampling.sample`'s entry point)."""
        off = torch.tensor([self.cursor])
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

    def confidence(self, conf: torch.Tensor) -> torch.Tensor:
        """A draft's chance of acceptance here from its confidence c, a chance under rejection sampling (1 − TV): the
        coupling's guarantee (1 − TV) / (1 + TV) = c / (2 − c) (Daliri, Musco, Suresh 2024). A lower bound: ``auto``'s
        online correction raises it where this run's rounds accept more."""
        c = conf.clamp(0, 1)
        return c / (2 - c)

    def first_tokens(self, requests: list[Request], laws: torch.Tensor) -> torch.Tensor:
        """The first generated token sits at position len(prompt)."""
        return sample(laws, self.params, self._noise(requests, [len(r.prompt) for r in requests]))

    @contextmanager
    def drafting(self, requests: list[Request]) -> Iterator[CoupledNoise]:
        """x_k at P + k from the noise the target will use there."""
        yield self._noise(requests, draft=True)

    def accept(self, requests: list[Request], drafts: torch.Tensor, q: torch.Tensor, p: torch.Tensor,
               lengths: torch.Tensor) -> Acceptance:  # fmt: skip
        return accept_coupled(drafts, p, lengths, self._noise(requests))

    def _noise(self, requests: list[Request], base: list[int] | None = None, draft: bool = False) -> CoupledNoise:
        """The noise of ``requests`` from position ``base`` (default: after each anchor); ``draft``: over the draft
        vocabulary's columns (when the drafter has a reduced one)."""
        base = [r.pos + 1 for r in requests] if base is None else base
        return CoupledNoise([r.key for r in requests], base, self.device, vocab=self.draft_vocab if draft else None)
