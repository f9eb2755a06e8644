"""Autoregressive chain drafters: EAGLE-3 and MTP (docs/algorithm.md §7), the baselines DSpark is compared against.

Both run one causal decoder layer over *pairs* (feature of position t, token x_{t+1}) and predict
x_{t+2}; drafting a block is a chain of γ steps, each feeding back the layer's own output hidden
and the token it just sampled, so draft latency grows with γ (the point of the comparison).

- ``eagle3``: the feature is W_f [tapped target layers] (Linear n·d -> d, no norm); the layer input
  is [RMSNorm(E(x)); RMSNorm(f)] in R^{2d}, the residual is the un-normed f, then a post-norm MLP,
  a fresh final norm and the frozen LM head. Trained with the training-time test (TTT).
- ``mtp1``: the feature is the target's final hidden state h_t (after its final norm);
  h' = W_p [RMSNorm(h_t); RMSNorm(E(x))] then a pre-norm decoder layer, a final norm and the LM head.
  One draft per round (``block_size=1``); ``block_size=k`` is the static MTP-k recursion.

Training (``forward``) uses the same anchors and block alignment as the parallel drafters: for an
anchor a, step s pairs the feature of a-1+s (the target's for s = 0, the layer's own output after)
with x_{a+s} and predicts x_{a+s+1}. Step 0 runs causally over the whole sequence (its keys are the
context every later step sees); steps s >= 1 run only at the anchors, each query attending to the
step-0 keys at positions <= a-1 plus the same anchor's keys of steps 1..s (the TTT diagonal), with
RoPE positions a-1+s. Inference (:class:`~dspark_lightning.infer.propose.chain.ChainProposer`) computes exactly
this with a cache of step-0 keys of committed positions.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import nn

from ..checks import UsageError, at_least
from ..layers import InjectedAttention, RMSNorm, SwiGLU, rope_cos_sin
from ..registry import register
from ..targets import TargetGeometry
from .drafter import CONVENTION, DraftOutput, SharesTargetParts

KINDS = ("eagle3", "mtp")


class ChainLayer(nn.Module):
    """One decoder layer over (feature, token embedding) pairs; ``kind`` selects the EAGLE-3 or MTP input."""

    def __init__(self, g: TargetGeometry, kind: str, intermediate_size: int | None = None) -> None:
        super().__init__()
        if kind not in KINDS:
            raise UsageError(f"chain layer kind must be one of {KINDS}, got {kind!r}")
        d, eps = g.hidden_size, g.rms_norm_eps
        self.kind = kind
        self.token_norm = RMSNorm(d, eps)
        self.feature_norm = RMSNorm(d, eps)
        if kind == "mtp":
            self.proj = nn.Linear(2 * d, d, bias=False)  # W_p
            self.input_norm = RMSNorm(d, eps)
        in_dim = 2 * d if kind == "eagle3" else d
        self.attn = InjectedAttention(d, g.num_heads, g.num_kv_heads, g.head_dim, qk_norm=False, eps=eps, in_dim=in_dim)
        self.post_norm = RMSNorm(d, eps)
        self.mlp = SwiGLU(d, intermediate_size or g.intermediate_size)
        self.norm = RMSNorm(d, eps)  # fresh final norm before the frozen LM head
        self.geometry = g

    def pair(self, feature: torch.Tensor, tok_emb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(attention input, residual) of a (feature, token) pair, both (..., d)."""
        tok_emb = tok_emb.to(feature.dtype)  # the target's embedding may run in another precision
        if self.kind == "eagle3":
            return torch.cat([self.token_norm(tok_emb), self.feature_norm(feature)], -1), feature
        h = self.proj(torch.cat([self.feature_norm(feature), self.token_norm(tok_emb)], -1))
        return self.input_norm(h), h

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_cos_sin(positions, self.geometry.head_dim, self.geometry.rope_theta)

    def forward(self, x, residual, cos, sin, ctx_k, ctx_v, mask) -> torch.Tensor:
        """Output hidden (before the final norm) of queries ``x`` (B, L, in) over [context; own] keys."""
        h = residual + self.attn(x, cos, sin, ctx_k, ctx_v, mask)
        return h + self.mlp(self.post_norm(h))


class ChainDrafter(SharesTargetParts, nn.Module):
    """EAGLE-3 / MTP drafter: a :class:`ChainLayer`, a feature map, the target's frozen embedding and LM head.

    Args:
        geometry: target geometry.
        embed, lm_head: the target's modules, held by reference (never trained or saved).
        kind: ``eagle3`` (fused tapped features) or ``mtp`` (the target's final hidden state).
        block_size: drafts per round at inference (γ; MTP-1: 1).
        ttt_steps: training-time-test steps (default γ).
        intermediate_size: MLP width (default: the target's).
    """

    proposer_name = "chain"  # the runtime's proposer for it (registry kind "proposer", infer/propose/chain.py)

    def __init__(
        self,
        *,
        geometry: TargetGeometry,
        embed: nn.Embedding,
        lm_head: nn.Linear,
        kind: str = "eagle3",
        block_size: int = 7,
        ttt_steps: int | None = None,
        intermediate_size: int | None = None,
        name: str | None = None,
        draft_vocab_size: int | None = None,
    ) -> None:
        super().__init__()
        at_least("block_size", block_size, 1)  # an int: a string or a float is named here, not compared below
        self.geometry, self.kind, self.block_size = geometry, kind, block_size
        self.ttt_steps = block_size if ttt_steps is None else int(ttt_steps)
        if self.ttt_steps < 1:
            raise UsageError(f"ttt_steps must be >= 1, got {self.ttt_steps}")
        self.layer = ChainLayer(geometry, kind, intermediate_size)
        if kind == "eagle3":
            self.fc = nn.Linear(geometry.n_tapped * geometry.hidden_size, geometry.hidden_size, bias=False)  # W_f
        self.registered_name = name or ("eagle3" if kind == "eagle3" else "mtp1")
        self.hparams = {"ttt_steps": self.ttt_steps, "intermediate_size": intermediate_size}
        if draft_vocab_size is not None:
            self.hparams["draft_vocab_size"] = draft_vocab_size
            geometry = replace(geometry, draft_vocab_size=draft_vocab_size)
            self.geometry = geometry
        self.convention = CONVENTION
        self.seq_head = self.conf_head = None  # no sequential or confidence head: ĉ is the draft's top probability
        self._shared = (embed, lm_head)  # a tuple attribute is not a registered sub-module
        self._init_draft_vocab(geometry)

    def config(self) -> dict[str, Any]:
        return {
            "convention": self.convention,
            "drafter": {"class_path": self.registered_name, "init_args": dict(self.hparams)},
            "block_size": self.block_size,
            "geometry": self.geometry.to_dict(),
        }

    def features(self, context: torch.Tensor, hidden: torch.Tensor | None) -> torch.Tensor:
        """Per-position feature f_t (…, d): W_f [tapped] for EAGLE-3, the target's final hidden for MTP."""
        dtype = self.layer.norm.weight.dtype  # the drafter's precision, whatever the target's
        if self.kind == "eagle3":
            return self.fc(context.to(dtype))
        if hidden is None:
            raise UsageError("the MTP drafter needs the target's final hidden states")
        return hidden.to(dtype)

    def logits(self, h: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        """Draft logits over the draft vocabulary (…, N or V); ``weight`` = a cached :meth:`draft_head_weight`."""
        return self.draft_logits(self.layer.norm(h), weight)

    # --- training forward (TTT) --------------------------------------------------------------
    def forward(
        self,
        context: torch.Tensor,  # (B, S, n*d)
        input_ids: torch.Tensor,  # (B, S)
        anchors: torch.Tensor,  # (B, A)
        valid: torch.Tensor,  # (B, A)
        hidden: torch.Tensor | None = None,  # (B, S, d) target final hidden states
        block_size: int | None = None,  # must be None or the drafter's own: a chain drafter trains its full chain
        full_vocab: bool = True,  # False: logits over the draft vocabulary only
    ) -> DraftOutput:
        if block_size not in (None, self.ttt_steps):
            raise UsageError(f"{type(self).__name__} trains its {self.ttt_steps} chain steps; no shorter block")
        B, S = input_ids.shape
        A, g = anchors.shape[1], self.ttt_steps
        dev = input_ids.device
        lay = self.layer
        feat = self.features(context, hidden)  # (B, S, d)
        nxt = torch.cat([input_ids[:, 1:], input_ids[:, -1:]], 1)  # x_{t+1}
        x0, res0 = lay.pair(feat, self.embed(nxt))
        pos = torch.arange(S, device=dev).expand(B, S)
        cos, sin = lay.rope(pos)
        k0, v0 = lay.attn.kv(x0, cos, sin)  # (B, Hkv, S, Dh) step-0 keys of every position
        causal = torch.ones(S, S, dtype=torch.bool, device=dev).tril().expand(B, S, S)
        empty = k0[:, :, :0]
        h0 = lay(x0, res0, cos, sin, empty, empty, causal)  # (B, S, d)
        t = (anchors - 1).clamp(min=0)  # (B, A) index whose feature pairs with the anchor token
        h = torch.gather(h0, 1, t[..., None].expand(B, A, h0.shape[-1]))
        outs = [h]
        ctx_mask = torch.arange(S, device=dev)[None, None, :] <= t[:, :, None]  # (B, A, S) step-0 keys <= a-1
        eye = torch.eye(A, dtype=torch.bool, device=dev).expand(B, A, A)
        ks, vs = [k0], [v0]
        for s in range(1, g):
            tok = torch.gather(input_ids, 1, (anchors + s).clamp(max=S - 1))  # x_{a+s}
            x, res = lay.pair(h, self.embed(tok))
            cos, sin = lay.rope(t + s)
            mask = torch.cat([ctx_mask, *([eye] * (s - 1)), eye], -1)  # step-0 causal, diagonal of steps 1..s
            h = lay(x, res, cos, sin, torch.cat(ks, 2), torch.cat(vs, 2), mask)
            k, v = lay.attn.kv(x, cos, sin)
            ks.append(k)
            vs.append(v)
            outs.append(h)
        hs = torch.stack(outs, 2)  # (B, A, g, d)
        z = self.logits(hs)
        return DraftOutput(logits=self.full_logits(z) if full_vocab else z, conf_logits=None, hidden=hs)


def _chain(target: Any, kind: str, name: str, block_size: int, **kwargs) -> ChainDrafter:
    return ChainDrafter(
        geometry=target.geometry,
        embed=target.embed_tokens,
        lm_head=target.lm_head,
        kind=kind,
        block_size=block_size,
        name=name,
        **kwargs,
    )


@register("drafter", "eagle3")
def eagle3(
    target: Any,
    block_size: int = 7,
    ttt_steps: int | None = None,
    intermediate_size: int | None = None,
    draft_vocab_size: int | None = None,
) -> ChainDrafter:
    """EAGLE-3: one autoregressive layer on fused tapped target features, TTT over γ steps, chain drafting."""
    return _chain(target, "eagle3", "eagle3", block_size, ttt_steps=ttt_steps, intermediate_size=intermediate_size,
                  draft_vocab_size=draft_vocab_size)  # fmt: skip


@register("drafter", "mtp1")
def mtp1(
    target: Any,
    block_size: int = 1,
    ttt_steps: int | None = None,
    intermediate_size: int | None = None,
    draft_vocab_size: int | None = None,
) -> ChainDrafter:
    """MTP-1 (DeepSeek-V3 style) on the target's final hidden state; ``block_size=k`` is static MTP-k."""
    return _chain(target, "mtp", "mtp1", block_size, ttt_steps=ttt_steps, intermediate_size=intermediate_size,
                  draft_vocab_size=draft_vocab_size)  # fmt: skip
