"""What every parallel backbone shares: fusion of the tapped target features, KV injection, RoPE.

A backbone is built from decoder layers whose attention is an :class:`InjectedAttention` (queries
from the block, keys/values from [context; block], docs/algorithm.md §3.2). Each layer may have its own
attention window over the context (``layer_windows``; None = full), so callers build one mask per
distinct window and pass a list (or a single mask when all layers agree).
"""

from __future__ import annotations

import torch
from torch import nn

from ...layers import InjectedAttention, RMSNorm, rope_cos_sin
from ...targets import TargetGeometry

KV = tuple[torch.Tensor, torch.Tensor]


class DecoderLayer(nn.Module):
    """Pre-norm block: h += Attn(norm(h), C); h += MLP(norm(h)). The MLP is a SwiGLU or an MoE."""

    def __init__(self, g: TargetGeometry, qk_norm: bool, mlp: nn.Module) -> None:
        super().__init__()
        self.input_norm = RMSNorm(g.hidden_size, g.rms_norm_eps)
        self.attn = InjectedAttention(g.hidden_size, g.num_heads, g.num_kv_heads, g.head_dim, qk_norm, g.rms_norm_eps)
        self.post_norm = RMSNorm(g.hidden_size, g.rms_norm_eps)
        self.mlp = mlp

    def forward(self, h, cos, sin, ctx_kv: KV, mask) -> torch.Tensor:
        ctx_k, ctx_v = (ctx_kv, None) if hasattr(ctx_kv, "lookahead") else ctx_kv  # (K, V) or a cache layer
        h = h + self.attn(self.input_norm(h), cos, sin, ctx_k, ctx_v, mask)
        return h + self.mlp(self.post_norm(h))


class InjectedBackbone(nn.Module):
    """Fusion W_c + RMSNorm, decoder layers, a fresh final norm. Subclasses build ``self.layers``."""

    layer_windows: list[int | None]  # context window of each layer (None = full attention)

    context_state: bool = False

    def _build_common(self, g: TargetGeometry, context_state: bool = False) -> None:
        self.geometry = g
        self.fc = nn.Linear(g.n_tapped * g.hidden_size, g.hidden_size, bias=False)  # W_c
        self.fuse_norm = RMSNorm(g.hidden_size, g.rms_norm_eps)
        self.norm = RMSNorm(g.hidden_size, g.rms_norm_eps)  # fresh final norm (not copied)
        self.context_state = bool(context_state)
        if self.context_state:  # W_s, zeroed after init_weights (zero_state_proj): starts as the plain design
            self.state_proj = nn.Linear(g.hidden_size, g.hidden_size, bias=False)

    def zero_state_proj(self) -> None:
        if self.context_state:
            nn.init.zeros_(self.state_proj.weight)

    def inject_state(self, x: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """Block inputs x (..., γ, d) + W_s h^T_{a-1} (..., d) on every slot: the target's final hidden state of the
        last context position (the one that produced the anchor) reaches slot 1 directly, as in MTP / EAGLE."""
        return x + self.state_proj(state)[..., None, :]

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_cos_sin(positions, self.geometry.head_dim, self.geometry.rope_theta)

    def fuse(self, context: torch.Tensor) -> torch.Tensor:
        """Raw tapped features (B, S, n*d) -> C (B, S, d) = RMSNorm(W_c [H_l1; ...; H_ln])."""
        return self.fuse_norm(self.fc(context))

    def context_kv(self, fused: torch.Tensor, positions: torch.Tensor) -> list[KV]:
        """Per-layer context keys/values (B, Hkv, S, Dh) of fused features at absolute positions (B, S)."""
        cos, sin = self.rope(positions)
        return [layer.attn.kv(fused, cos, sin) for layer in self.layers]

    def forward(
        self,
        x: torch.Tensor,  # (B, L, d) embedded block tokens
        positions: torch.Tensor,  # (B, L) block positions
        ctx_kv: list[KV],  # from context_kv
        mask: torch.Tensor | list[torch.Tensor],  # (B, L, S+L) bool, or one per layer (per-layer windows)
    ) -> torch.Tensor:
        cos, sin = self.rope(positions)
        masks = mask if isinstance(mask, list | tuple) else [mask] * len(self.layers)
        h = x
        for layer, kv, m in zip(self.layers, ctx_kv, masks, strict=True):
            h = layer(h, cos, sin, kv, m)
        return self.norm(h)  # (B, L, d)


def per_layer_masks(backbone: nn.Module, build) -> torch.Tensor | list[torch.Tensor]:
    """``build(window)`` once per distinct window of ``backbone.layer_windows``; a single mask when all agree."""
    windows = list(getattr(backbone, "layer_windows", None) or [getattr(backbone, "sliding_window", None)])
    cache = {w: build(w) for w in dict.fromkeys(windows)}
    return cache[windows[0]] if len(cache) == 1 else [cache[w] for w in windows]
