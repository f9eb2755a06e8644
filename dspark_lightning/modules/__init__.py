"""Config-free building blocks (no registry, no recipe knowledge)."""

from .layers import InjectedAttention, RMSNorm, SwiGLU, apply_rope, rope_cos_sin
from .masks import block_attention_mask

__all__ = ["InjectedAttention", "RMSNorm", "SwiGLU", "apply_rope", "block_attention_mask", "rope_cos_sin"]
