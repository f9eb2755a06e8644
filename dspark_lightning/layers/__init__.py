"""Config-free building blocks (no registry, no recipe knowledge)."""

from .masks import block_attention_mask
from .moe import MoE, Router, moe_aux_loss, moe_loads
from .transformer import InjectedAttention, RMSNorm, SwiGLU, apply_rope, grouped_attention, rope_cos_sin

__all__ = [
    "InjectedAttention",
    "MoE",
    "RMSNorm",
    "Router",
    "SwiGLU",
    "apply_rope",
    "block_attention_mask",
    "grouped_attention",
    "moe_aux_loss",
    "moe_loads",
    "rope_cos_sin",
]
