"""Attention masks for anchor-packed training blocks (docs/algorithm.md §3.4). Dense boolean masks (fine on CPU)."""

from __future__ import annotations

import torch


def block_attention_mask(
    anchors: torch.Tensor,  # (B, A) anchor positions
    valid: torch.Tensor,  # (B, A) bool, False for dummy (padding) blocks
    ctx_len: int,
    block_size: int,
    window: int | None = None,
) -> torch.Tensor:
    """Mask (B, A*γ, S + A*γ), True = may attend.

    A query of block b (anchor a_b) sees context key t iff t < a_b (strictly before the anchor;
    also t >= a_b - window with a sliding window) and the keys of its own block, bidirectionally.
    Dummy-block rows see nothing.
    """
    B, A = anchors.shape
    g = block_size
    t = torch.arange(ctx_len, device=anchors.device)  # (S,)
    a = anchors[:, :, None]  # (B, A, 1)
    ctx = t < a  # (B, A, S)
    if window is not None:
        ctx = ctx & (t >= a - window)
    ctx = ctx & valid[:, :, None]
    ctx = ctx[:, :, None, :].expand(B, A, g, ctx_len).reshape(B, A * g, ctx_len)
    blk_id = torch.arange(A, device=anchors.device).repeat_interleave(g)  # (A*γ,)
    own = blk_id[:, None] == blk_id[None, :]  # (A*γ, A*γ)
    row_valid = valid.repeat_interleave(g, dim=1)  # (B, A*γ)
    blk = own[None] & row_valid[:, :, None]  # (B, A*γ, A*γ)
    return torch.cat([ctx, blk], dim=-1)
