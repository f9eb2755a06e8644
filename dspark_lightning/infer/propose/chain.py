"""Chain drafting for the autoregressive drafters (EAGLE-3, MTP-k; :mod:`dspark_lightning.drafters.chain`).

The cache holds the step-0 keys/values of every *committed* pair (feature of t, token x_{t+1}).
A pair is complete only once x_{t+1} is committed, so :meth:`ChainProposer.extend` keeps the new
features pending and :meth:`ChainProposer.propose` pairs them with the tokens of the request's
history (the last one is the anchor), runs step 0 over them causally (this fills the cache and
gives the first draft's hidden at P-1), then chains γ-1 more steps, each one query per request
over [cached keys; this round's earlier step keys; itself] at RoPE position P-1+s. Nothing drafted
enters the cache, so rejections need no rollback.
"""

from __future__ import annotations

import torch

from ...checks import UsageError
from ...drafters.chain import ChainDrafter
from ...registry import register
from ..acceptance.sampling import SamplingParams, probs, sample
from ..verify.kvcache import KVLayer
from .draft import Proposal
from .proposer import ProposerBase, draft_confidence


class ChainProposer(ProposerBase):
    """The :class:`~.protocols.Proposer` of the chain drafters (see the module docstring)."""

    def __init__(self, drafter, batching: str = "padded") -> None:
        super().__init__(drafter, [KVLayer()], batching)
        self.pending: dict[int, tuple[int, torch.Tensor]] = {}  # rid -> (first position, features (L, d))

    def forget(self, ids: list[int]) -> None:
        for rid in ids:
            self.pending.pop(rid, None)

    @torch.no_grad()
    def extend(self, ids, context, start, lengths, hidden=None) -> None:
        """Hold the features of positions start..start+lengths-1 until their next tokens are known (``start``
        and ``lengths`` on the host, as the engine passes them)."""
        n, starts = lengths.tolist(), start.tolist()
        W = max(n, default=0)
        feats = self.drafter.features(context[:, :W], None if hidden is None else hidden[:, :W])
        for i, rid in enumerate(ids):
            f, s0 = feats[i, : n[i]], starts[i]
            if rid in self.pending:
                p0, old = self.pending[rid]
                if p0 + old.shape[0] != s0:
                    raise RuntimeError(f"request {rid}: features for position {s0} follow position {p0 + len(old) - 1}")
                s0, f = p0, torch.cat([old, f])
            self.pending[rid] = (s0, f)

    def _ctx(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        layer = self.kv.layers[0]
        if layer.keys is not None:
            return layer.keys, layer.values
        attn = self.drafter.layer.attn
        empty = torch.zeros(rows, attn.num_kv_heads, 0, attn.head_dim, device=self.device, dtype=self.dtype)
        return empty, empty

    @torch.no_grad()
    def _step0(self, ids, anchor_pos, requests) -> torch.Tensor:
        """Pair the pending features with their next tokens, run them causally, cache their keys; h at P-1 (R, d)."""
        d, lay = self.drafter, self.drafter.layer
        if requests is None:
            raise UsageError("chain drafting needs the requests' token histories (requests=)")
        starts, feats, toks = [], [], []
        for rid, r in zip(ids, requests, strict=True):
            s0, f = self.pending.pop(rid)
            hist = r.prompt + r.output  # x_0 .. x_P (the anchor)
            P = len(hist) - 1  # the anchor's position, from the host (anchor_pos holds it on the device)
            if s0 + f.shape[0] != P:
                raise RuntimeError(f"request {rid}: pending features end at {s0 + f.shape[0] - 1}, anchor is at {P}")
            starts.append(s0)
            feats.append(f)
            toks.append(torch.as_tensor(hist[s0 + 1 : P + 1], dtype=torch.long))
        R = len(ids)
        lens_h = [f.shape[0] for f in feats]
        lens = torch.as_tensor(lens_h, dtype=torch.long).to(self.device, non_blocking=True)
        grid = self.kv.grid(ids, lens_h)
        self.held.update((rid, s0 + n) for rid, s0, n in zip(ids, starts, lens_h, strict=True))
        F = torch.nn.utils.rnn.pad_sequence(feats, batch_first=True)
        T = torch.nn.utils.rnn.pad_sequence(toks, batch_first=True).to(self.device)
        pos = torch.as_tensor(starts, device=self.device)[:, None] + torch.arange(F.shape[1], device=self.device)
        x, res = lay.pair(grid.scatter(F, 0.0), d.embed(grid.scatter(T, 0)))
        q_owner = self._owners(grid, ids)
        q_pos = grid.scatter(pos, 0)
        cos, sin = lay.rope(q_pos)
        same = (q_owner[:, :, None] == q_owner[:, None, :]) & (q_owner[:, :, None] >= 0)
        mask = torch.cat([self.kv.attend(q_owner, q_pos), same & (q_pos[:, None, :] <= q_pos[:, :, None])], -1)
        ctx_k, ctx_v = self._ctx(x.shape[0])
        h = grid.gather(lay(x, res, cos, sin, ctx_k, ctx_v, mask))  # (R, W, d)
        self._commit([lay.attn.kv(x, cos, sin)], q_owner, q_pos)
        return h[torch.arange(R, device=self.device), lens - 1]

    @torch.no_grad()
    def propose(
        self,
        ids: list[int],
        anchors: torch.Tensor,  # (R,)
        anchor_pos: torch.Tensor,  # (R,)
        params: SamplingParams,
        generator: torch.Generator | None = None,
        teacher_tokens: torch.Tensor | None = None,  # (R, γ) force the drafted tokens (parity tests)
        requests=None,
    ) -> Proposal:
        d, lay, g = self.drafter, self.drafter.layer, self.block_size
        R = len(ids)
        h = self._step0(ids, anchor_pos, requests)  # (R, d): predicts x_{P+1}
        grid = self.kv.grid(ids, [1] * R)
        c_owner = self._owners(grid, ids)  # (rows, L): one query per request
        self_ok = (c_owner[:, :, None] == c_owner[:, None, :]) & (c_owner[:, :, None] >= 0)
        ctx_mask = self.kv.attend(c_owner, grid.scatter((anchor_pos - 1)[:, None], 0))  # committed keys only
        ctx_k, ctx_v = self._ctx(c_owner.shape[0])  # grows by each step's keys, written past the cached ones
        toks, qs, confs, zs = [], [], [], []
        for s in range(g):
            z = d.logits(h, self.head_w)  # (R, N or V)
            q = probs(z, params)
            confs.append(draft_confidence(q, z, params))
            x = self._target_ids(sample(q, params, generator)) if teacher_tokens is None else teacher_tokens[:, s]
            toks.append(x)
            qs.append(q)
            zs.append(z)
            if s == g - 1:
                break
            xin, res = lay.pair(grid.scatter(h[:, None], 0.0), d.embed(grid.scatter(x[:, None], 0)))
            cos, sin = lay.rope(grid.scatter((anchor_pos + s)[:, None], 0))  # position P-1+(s+1)
            mask = torch.cat([ctx_mask, *([self_ok] * s), self_ok], -1)  # [context; steps < s; itself]
            h = grid.gather(lay(xin, res, cos, sin, ctx_k, ctx_v, mask))[:, 0]
            k, v = lay.attn.kv(xin, cos, sin)
            ctx_k, ctx_v = self.kv.layers[0].lookahead(k, v, offset=s * k.shape[2])  # uncommitted: no rollback
        q, z = self._target_laws(torch.stack(qs, 1), torch.stack(zs, 1))
        return Proposal(tokens=torch.stack(toks, 1), q=q, conf=torch.stack(confs, 1), logits=z)


@register("proposer", "chain")
def chain_proposer(drafter: ChainDrafter, batching: str = "padded", confidence=None) -> ChainProposer:
    """The proposer of the chain drafters (:class:`ChainDrafter` ``proposer_name = "chain"``)."""
    if confidence is not None:
        raise UsageError(f"{drafter.registered_name} has no confidence head to calibrate")
    return ChainProposer(drafter, batching=batching)
