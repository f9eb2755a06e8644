"""Config-free building blocks: RMSNorm, RoPE, SwiGLU, and attention with injected context K/V.

Flat typed arguments only; no registry, no recipe knowledge.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary tables for integer ``positions`` (B, L) -> cos, sin (B, 1, L, head_dim) (HF rotate-half layout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    freqs = positions.float()[..., None] * inv_freq  # (B, L, head_dim/2)
    emb = torch.cat([freqs, freqs], dim=-1)  # (B, L, head_dim)
    return emb.cos()[:, None].to(dtype), emb.sin()[:, None].to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, L, Dh) rotated by cos/sin (B, 1, L, Dh)."""
    x1, x2 = x.chunk(2, dim=-1)
    return (x * cos + torch.cat([-x2, x1], dim=-1) * sin).to(x.dtype)  # fp32 tables keep a bf16 x in bf16


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


@functools.cache
def sdpa_has_gqa() -> bool:
    """Whether this torch's ``scaled_dot_product_attention`` takes ``enable_gqa`` (torch >= 2.5); probed once."""
    x = torch.zeros(1, 2, 1, 1)
    try:
        F.scaled_dot_product_attention(x, x[:, :1], x[:, :1], enable_gqa=True)
    except TypeError:
        return False
    return True


def _kernel_takes_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """Whether SDPA runs grouped K/V in a fused kernel for these inputs. Where only the math backend takes them
    (masked GQA in the CUDA memory-efficient kernel of older torch releases, head_dim > 256, ...), math would
    materialise the (B, H, L, S) scores: repeating K/V for a fused kernel costs far less. A host-side check of
    shapes, strides and dtypes (no device sync), the one SDPA makes itself to pick its kernel."""
    if not sdpa_has_gqa():
        return False
    from torch.nn.attention import SDPBackend  # torch >= 2.2, as enable_gqa

    return torch._fused_sdp_choice(q, k, v, mask, 0.0, False, enable_gqa=True) != int(SDPBackend.MATH)


def grouped_attention(
    q: torch.Tensor,  # (B, H, L, Dh)
    k: torch.Tensor,  # (B, Hkv, S, Dh), H a multiple of Hkv: query head h reads key/value head h // (H / Hkv)
    v: torch.Tensor,  # (B, Hkv, S, Dh)
    mask: torch.Tensor | None = None,  # (B, 1, L, S) bool (True = may attend) or additive float
) -> torch.Tensor:
    """Scaled dot-product attention with grouped-query K/V -> (B, H, L, Dh).

    The fused kernel reads each K/V head for its group of query heads (``enable_gqa``), so the (B, H, S, Dh) copies
    of K and V that ``repeat_interleave`` makes (and autograd keeps) are never built; without a fused kernel for
    grouped heads (older torch, see :func:`_kernel_takes_gqa`) K/V are repeated as before. Same values either way
    (tests/unit/test_gqa_attention.py)."""
    rep = q.shape[1] // k.shape[1]
    if rep == 1:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    if _kernel_takes_gqa(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)  # (B, H, S, Dh)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class InjectedAttention(nn.Module):
    """Attention whose queries come from the block and whose keys/values are [context; block].

    docs/algorithm.md §3.2: K = [W_k C; W_k h], V = [W_v C; W_v h] with the same W_k/W_v for both; per-head
    q_norm/k_norm (Qwen3) on every query and key; GQA; scale head_dim^-1/2.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        qk_norm: bool = True,
        eps: float = 1e-6,
        in_dim: int | None = None,
    ) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        in_dim = in_dim or dim  # EAGLE-3's layer reads 2d inputs and writes d
        self.q_proj = nn.Linear(in_dim, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(in_dim, num_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(in_dim, num_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, dim, bias=False)
        self.q_norm = RMSNorm(head_dim, eps) if qk_norm else nn.Identity()
        self.k_norm = RMSNorm(head_dim, eps) if qk_norm else nn.Identity()

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        B, L, _ = x.shape
        return x.view(B, L, n, self.head_dim).transpose(1, 2)  # (B, n, L, Dh)

    def kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (normed, rotated) and values of x (B, L, d) -> (B, Hkv, L, Dh) each. Context K/V can be cached."""
        k = apply_rope(self.k_norm(self._heads(self.k_proj(x), self.num_kv_heads)), cos, sin)
        v = self._heads(self.v_proj(x), self.num_kv_heads)
        return k, v

    def forward(
        self,
        h: torch.Tensor,  # (B, L, d) normed block states
        cos: torch.Tensor,  # (B, 1, L, Dh) block positions
        sin: torch.Tensor,
        ctx_k,  # (B, Hkv, S, Dh) context keys (already rotated), or a cache layer with ``lookahead`` (ctx_v None)
        ctx_v: torch.Tensor | None,  # (B, Hkv, S, Dh)
        mask: torch.Tensor,  # (B, L, S+L) bool, True = may attend
    ) -> torch.Tensor:
        q = apply_rope(self.q_norm(self._heads(self.q_proj(h), self.num_heads)), cos, sin)  # (B, H, L, Dh)
        k_blk, v_blk = self.kv(h, cos, sin)
        if ctx_v is None:  # a preallocated cache: the block is written past its keys, no copy of the context
            k, v = ctx_k.lookahead(k_blk, v_blk, 0)
        else:
            k = torch.cat([ctx_k, k_blk], dim=2)  # (B, Hkv, S+L, Dh)
            v = torch.cat([ctx_v, v_blk], dim=2)
        live = mask.any(-1, keepdim=True)  # (B, L, 1) rows with at least one key (dummy rows have none)
        safe = mask | ~live  # avoid NaN softmax on fully masked rows; their output is zeroed below
        out = grouped_attention(q, k, v, safe[:, None])  # (B, H, L, Dh)
        out = out.transpose(1, 2).reshape(h.shape[0], h.shape[1], -1) * live
        return self.o_proj(out)
