"""Step 5 of a round: lossless acceptance (docs/algorithm.md §1), vectorised over requests.

Glossary (vLLM's rejection sampler):
- accepted tokens: the longest draft prefix x_1..x_m that passes u_k < p_t,k(x_k) / q_k(x_k);
- recovered token: drawn from norm(max(0, p_t,k* - q_k*)) at the first rejection k*;
- bonus token: drawn from p_t,l+1 when all l verified drafts are accepted.
Greedy (T -> 0): accept iff x_k = argmax p_t,k; the recovered or bonus token is argmax p_t.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ...checks import UsageError
from ...registry import register
from .sampling import Generators, SamplingParams, Streams, reads_are_free, sample, uniforms

if TYPE_CHECKING:
    from ..request import Request

RESIDUAL_GUARD = 1e-8


@dataclass
class Acceptance:
    accepted: torch.Tensor  # (R,) m_r, accepted drafts (before any stop-token cut)
    next_token: torch.Tensor  # (R,) recovered (m_r < l_r) or bonus (m_r = l_r) token


def accept(
    drafts: torch.Tensor,  # (R, γ) draft tokens x_1..x_γ
    q: torch.Tensor,  # (R, γ, V) fp32 draft laws the drafts were sampled from
    p: torch.Tensor,  # (R, W, V) fp32 target laws p_t,1..p_t,W with W >= max(l) + 1
    lengths: torch.Tensor,  # (R,) verification lengths l_r, best on the host (the engine's copy): checked there
    params: SamplingParams,
    generator: Generators = None,  # one stream, or one per request
) -> Acceptance:
    R, g = drafts.shape
    W = p.shape[1]
    if lengths.device.type == "cpu":  # a device copy is not read (a synchronisation): the engine passes its host l
        lmax = int(lengths.max()) if R else 0
        if W < lmax + 1:
            raise UsageError(f"target laws cover {W} positions, verification needs {lmax + 1}")
    lengths = lengths.to(drafts.device, non_blocking=True)
    k = min(g, W - 1)
    x = drafts[:, :k]  # (R, k)
    in_block = torch.arange(k, device=drafts.device) < lengths[:, None]  # (R, k)
    if params.greedy:
        ok = x == p[:, :k].argmax(-1)
    else:
        # per-request streams draw γ uniforms every round whatever the batch's widest block, so a request's
        # stream never depends on its neighbours (a shared stream draws only the k it needs)
        u = (
            uniforms(R, g, generator, drafts.device)[:, :k]
            if isinstance(generator, list | Streams)
            else uniforms(R, k, generator, drafts.device)
        )
        pt = p[:, :k].gather(-1, x[..., None]).squeeze(-1)  # (R, k) p_t,k(x_k)
        qd = q[:, :k].gather(-1, x[..., None]).squeeze(-1)  # (R, k) q_k(x_k)
        ok = u * qd < pt  # u < p/q without dividing (q(x_k) > 0 for a sampled x_k)
    m = (ok & in_block).long().cumprod(-1).sum(-1)  # (R,) leading run of accepts
    rows = torch.arange(R, device=drafts.device)
    p_next = p[rows, m]  # (R, V) law at the first unaccepted position
    rejected = m < lengths
    if params.greedy:
        return Acceptance(m, p_next.argmax(-1))
    law = p_next.clone()
    # no drafts (plain decoding): nothing to reject; the rejection test itself is a free shortcut on the host only
    if g > 0 and (not reads_are_free(p.device) or bool(rejected.any())):
        q_next = q[rows, m.clamp(max=g - 1)]
        resid = (p_next - q_next).clamp(min=0)
        mass = resid.sum(-1, keepdim=True)
        use_resid = rejected[:, None] & (mass > RESIDUAL_GUARD)  # residual guard: fall back to p_t
        law = torch.where(use_resid, resid / mass.clamp(min=RESIDUAL_GUARD), law)
    return Acceptance(m, sample(law, params, generator))


@register("acceptance", "rejection")
def rejection(params: SamplingParams, device: torch.device, proposer=None) -> RejectionAcceptance:
    """Speculative sampling's rejection test (the default acceptance mode). An acceptance mode is registered as a
    factory ``(params, device, proposer) -> AcceptanceMode`` (:class:`~..protocols.AcceptanceMode`)."""
    return RejectionAcceptance(params, device)


class RejectionAcceptance:
    """Rejection sampling (the default :class:`~.protocols.AcceptanceMode`): every request draws from its own two
    counter streams, one for drafting and one for its first token, the acceptance tests and the residual, so what it
    draws never depends on which other requests share its batch (docs/algorithm.md §10)."""

    def __init__(self, params: SamplingParams, device: torch.device) -> None:
        self.params, self.device = params, device

    def first_tokens(self, requests: list[Request], laws: torch.Tensor) -> torch.Tensor:
        streams = self._streams(requests)
        tokens = sample(laws, self.params, streams)
        _advance(requests, streams)
        return tokens

    @contextmanager
    def drafting(self, requests: list[Request]) -> Iterator[Streams]:
        """Row r draws from request r's drafting stream; its counter moves on by what the proposer drew."""
        streams = Streams([r.draft_key for r in requests], [r.draft_draws for r in requests], self.device)
        yield streams
        for r in requests:
            r.draft_draws += streams.used

    def accept(self, requests: list[Request], drafts: torch.Tensor, q: torch.Tensor, p: torch.Tensor,
               lengths: torch.Tensor) -> Acceptance:  # fmt: skip
        streams = self._streams(requests)
        res = accept(drafts, q, p, lengths, self.params, streams)
        _advance(requests, streams)
        return res

    def _streams(self, requests: list[Request]) -> Streams:
        return Streams([r.key for r in requests], [r.draws for r in requests], self.device)


def _advance(requests: list[Request], streams: Streams) -> None:
    """Every row drew ``streams.used`` numbers (the same for each: what a request draws never depends on the
    batch)."""
    for r in requests:
        r.draws += streams.used
