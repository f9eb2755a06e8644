"""Dense parallel backbone: KV injection of fused target features, queries from the block only (SPEC §3.2)."""

from __future__ import annotations

import torch
from torch import nn

from ...modules import InjectedAttention, RMSNorm, SwiGLU, rope_cos_sin
from ...registry import register
from ...targets import TargetGeometry
from ..common import capture_args, init_weights

KV = tuple[torch.Tensor, torch.Tensor]


class DecoderLayer(nn.Module):
    """Pre-norm block: h += Attn(norm(h), C); h += SwiGLU(norm(h))."""

    def __init__(self, g: TargetGeometry, qk_norm: bool) -> None:
        super().__init__()
        self.input_norm = RMSNorm(g.hidden_size, g.rms_norm_eps)
        self.attn = InjectedAttention(g.hidden_size, g.num_heads, g.num_kv_heads, g.head_dim, qk_norm, g.rms_norm_eps)
        self.post_norm = RMSNorm(g.hidden_size, g.rms_norm_eps)
        self.mlp = SwiGLU(g.hidden_size, g.intermediate_size)

    def forward(self, h, cos, sin, ctx_kv: KV, mask) -> torch.Tensor:
        h = h + self.attn(self.input_norm(h), cos, sin, ctx_kv[0], ctx_kv[1], mask)
        return h + self.mlp(self.post_norm(h))


@register("backbone", "dense")
class DenseBackbone(nn.Module):
    """N_d decoder layers with the target geometry; full attention (or a sliding window).

    Args:
        geometry: target shapes (supplied by the framework).
        num_layers: drafter depth N_d (5 offline, 3 in production).
        qk_norm: Qwen3-style per-head q/k RMSNorm.
        sliding_window: attend only to the last W context positions before the anchor (None = full).
    """

    def __init__(
        self, geometry: TargetGeometry, num_layers: int = 5, qk_norm: bool = True, sliding_window: int | None = None
    ) -> None:
        super().__init__()
        self.hparams = capture_args(locals())
        g = self.geometry = geometry
        self.sliding_window = sliding_window
        self.fc = nn.Linear(g.n_tapped * g.hidden_size, g.hidden_size, bias=False)  # W_c
        self.fuse_norm = RMSNorm(g.hidden_size, g.rms_norm_eps)
        self.layers = nn.ModuleList(DecoderLayer(g, qk_norm) for _ in range(num_layers))
        self.norm = RMSNorm(g.hidden_size, g.rms_norm_eps)  # fresh final norm (not copied)
        self.apply(init_weights)

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
        mask: torch.Tensor,  # (B, L, S+L) bool
    ) -> torch.Tensor:
        cos, sin = self.rope(positions)
        h = x
        for layer, kv in zip(self.layers, ctx_kv, strict=True):
            h = layer(h, cos, sin, kv, mask)
        return self.norm(h)  # (B, L, d)
