"""Warm start: initialise a parallel drafter's backbone from the target's own decoder layers.

Copies attention, MLP and norm weights of chosen target layers into the drafter's layers, makes the fusion
projection W_c the identity on one tapped layer's block (so C_t starts as that layer's normalised output, the
input the copied layer saw in the target), copies that layer's input norm into the fusion norm and the target's
final norm into the drafter's, and zeroes the Markov W2 and the confidence head (their outputs start at 0, the
sequential bias at none). Only the shapes the target and a dense drafter share are copied; anything else is an
error. A deviation from docs/algorithm.md §3.1's N(0, 0.02) initialisation, ablated in benchmarks/results/matrix.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class WarmStart:
    layers: list[int] | None = None
    """target layers copied into drafter layers 0..N-1 (null = the N layers after ``fuse_tap``, the ones that read
    its output in the target; the top N layers when fewer follow it)"""
    fuse_tap: int | None = None
    """tapped layer id whose block of W_c is the identity (null = the deepest tapped layer)"""
    final_norm: bool = True
    """copy the target's final norm into the drafter's (else the fresh ones of docs/algorithm.md §3.1)"""


# Target families whose decoder layer is the drafter's layer (pre-norm RMSNorm with weight w, SwiGLU, RoPE). Not
# Gemma: its norms scale by (1 + w), its MLP is GELU and it adds post-attention and post-MLP norms.
SAME_LAYERS = ("llama", "mistral", "qwen2", "qwen3")
_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")


def _copy(dst: nn.Module, src: nn.Module, what: str) -> None:
    if dst.weight.shape != src.weight.shape:
        raise ValueError(f"warm start: {what} has shape {tuple(src.weight.shape)} in the target, "
                         f"{tuple(dst.weight.shape)} in the drafter")  # fmt: skip
    if getattr(src, "bias", None) is not None:
        raise ValueError(f"warm start: the target's {what} has a bias the drafter does not")
    dst.weight.copy_(src.weight.to(dst.weight))


@torch.no_grad()
def warm_start(drafter: nn.Module, target, cfg: WarmStart) -> list[int]:
    """Initialise ``drafter`` (a :class:`~dspark_lightning.drafters.Drafter` with a dense backbone) from
    ``target``; returns the copied target layer ids."""
    kind = getattr(target.model.config, "model_type", "?")
    if kind not in SAME_LAYERS:
        raise ValueError(
            f"model.warm_start copies target layers into Qwen3-style drafter layers, which compute the same function "
            f"only for {', '.join(SAME_LAYERS)} targets; this target is {kind!r} (its norms, activation or layer "
            "layout differ): remove model.warm_start to train from the standard initialisation"
        )
    bb = getattr(drafter, "backbone", None)
    layers = getattr(bb, "layers", None)
    if layers is None or not hasattr(bb, "fc"):
        raise ValueError("model.warm_start needs a parallel drafter (backbone + heads), not a chain drafter")
    src_layers = target.decoder_layers
    L, N = len(src_layers), len(layers)
    taps = list(target.geometry.layer_ids)
    tap = taps[-1] if cfg.fuse_tap is None else cfg.fuse_tap
    if tap not in taps:
        raise ValueError(f"model.warm_start.fuse_tap must be one of the tapped layers {taps}, got {tap}")
    first = min(tap + 1, L - N) if cfg.layers is None else None
    ids = list(cfg.layers) if cfg.layers is not None else list(range(max(0, first), max(0, first) + N))
    if len(ids) != N or any(not 0 <= i < L for i in ids):
        raise ValueError(f"model.warm_start.layers must name {N} target layers in [0, {L}), got {ids}")
    for dst, i in zip(layers, ids, strict=True):
        src = src_layers[i]
        mlp = getattr(dst.mlp, "gate_proj", None)
        if mlp is None:
            raise ValueError("model.warm_start copies dense SwiGLU layers; this backbone's MLP is not one (MoE)")
        for n in _ATTN:
            _copy(getattr(dst.attn, n), getattr(src.self_attn, n), f"layer {i} self_attn.{n}")
        for n in _MLP:
            _copy(getattr(dst.mlp, n), getattr(src.mlp, n), f"layer {i} mlp.{n}")
        _copy(dst.input_norm, src.input_layernorm, f"layer {i} input_layernorm")
        _copy(dst.post_norm, src.post_attention_layernorm, f"layer {i} post_attention_layernorm")
    j, d = taps.index(tap), bb.fc.weight.shape[0]
    bb.fc.weight.zero_()
    bb.fc.weight[:, j * d : (j + 1) * d] = torch.eye(d)
    first = src_layers[ids[0]]
    _copy(bb.fuse_norm, first.input_layernorm, f"layer {ids[0]} input_layernorm (fusion norm)")
    if cfg.final_norm:
        _copy(bb.norm, target.decoder.norm, "final norm")
    sh, ch = getattr(drafter, "seq_head", None), getattr(drafter, "conf_head", None)
    if sh is not None and hasattr(sh, "lr"):
        sh.lr.w2.weight.zero_()
    if ch is not None:
        for p in ch.parameters():
            p.zero_()
    return ids
