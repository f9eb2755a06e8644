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

from ..checks import UsageError


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
        raise UsageError(f"warm start: {what} has shape {tuple(src.weight.shape)} in the target, "
                         f"{tuple(dst.weight.shape)} in the drafter")  # fmt: skip
    if getattr(src, "bias", None) is not None:
        raise UsageError(f"warm start: the target's {what} has a bias the drafter does not")
    dst.weight.copy_(src.weight.to(dst.weight))


@torch.no_grad()
def warm_start(drafter: nn.Module, target, cfg: WarmStart) -> list[int]:
    """Initialise ``drafter`` (a :class:`~dspark_lightning.drafters.Drafter` with a dense backbone) from
    ``target``; returns the copied target layer ids."""
    kind = getattr(target.model.config, "model_type", "?")
    if kind not in SAME_LAYERS:
        raise UsageError(
            f"model.warm_start copies target layers into Qwen3-style drafter layers, which compute the same function "
            f"only for {', '.join(SAME_LAYERS)} targets; this target is {kind!r} (its norms, activation or layer "
            "layout differ): remove model.warm_start to train from the standard initialisation"
        )
    bb = getattr(drafter, "backbone", None)
    layers = getattr(bb, "layers", None)
    if layers is None or not hasattr(bb, "fc"):
        raise UsageError("model.warm_start needs a parallel drafter (backbone + heads), not a chain drafter")
    src_layers = target.decoder_layers
    L, N = len(src_layers), len(layers)
    taps = list(target.geometry.layer_ids)
    tap = taps[-1] if cfg.fuse_tap is None else cfg.fuse_tap
    if tap not in taps:
        raise UsageError(f"model.warm_start.fuse_tap must be one of the tapped layers {taps}, got {tap}")
    first = min(tap + 1, L - N) if cfg.layers is None else None
    ids = list(cfg.layers) if cfg.layers is not None else list(range(max(0, first), max(0, first) + N))
    if len(ids) != N or any(not 0 <= i < L for i in ids):
        raise UsageError(f"model.warm_start.layers must name {N} target layers in [0, {L}), got {ids}")
    for dst, i in zip(layers, ids, strict=True):
        src = src_layers[i]
        mlp = getattr(dst.mlp, "gate_proj", None)
        if mlp is None:
            raise UsageError("model.warm_start copies dense SwiGLU layers; this backbone's MLP is not one (MoE)")
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


@dataclass
class Reuse:
    """What :func:`from_drafter` took from the source drafter."""

    copied: list[str]  # parameters and buffers copied whole
    remapped: list[str]  # draft-vocabulary rows copied by token id (the rest fresh)
    fresh: list[str]  # kept at this run's initialisation (absent from the source or of another shape)
    vocab: str  # how the draft vocabulary was set

    def summary(self) -> str:
        def short(names: list[str]) -> str:
            return ", ".join(names[:6]) + (f", ... ({len(names)} in all)" if len(names) > 6 else "") or "none"

        return (f"copied {len(self.copied)} tensors; draft vocabulary {self.vocab}; remapped by token id: "
                f"{short(self.remapped)}; fresh: {short(self.fresh)}")  # fmt: skip


@torch.no_grad()
def from_drafter(drafter: nn.Module, source: nn.Module, source_name: str = "the source drafter") -> Reuse:
    """Start ``drafter`` from ``source``'s weights (a drafter loaded from any folder the project reads).

    - Block sizes must agree (one line otherwise: the block is part of what the weights mean).
    - An unset draft vocabulary of the source's size takes the source's tokens; one set already (chosen from this
      run's data) keeps its tokens, and every tensor with a draft-vocabulary axis is remapped by token id: rows
      of tokens in both vocabularies are copied, the others stay fresh.
    - Every other tensor of the same name and shape is copied; the rest (a head the source lacks, another depth)
      stays at this run's initialisation.
    """
    if getattr(source, "block_size", None) != getattr(drafter, "block_size", None):
        raise UsageError(f"model.init_from: {source_name} drafts blocks of {getattr(source, 'block_size', '?')}, "
                         f"this recipe {getattr(drafter, 'block_size', '?')}: set model.block_size: "
                         f"{getattr(source, 'block_size', '?')} to continue from it")  # fmt: skip
    src_vocab, dst_vocab = getattr(source, "draft_vocab", None), getattr(drafter, "draft_vocab", None)
    if (src_vocab is None) != (dst_vocab is None):
        raise UsageError(f"model.init_from: {source_name} has {'no' if src_vocab is None else 'a'} reduced draft "
                         f"vocabulary, this recipe {'one' if src_vocab is None else 'none'}: set "
                         f"model.draft_vocab_size: {None if src_vocab is None else src_vocab.numel()}")  # fmt: skip
    vocab = "the full target vocabulary"
    row_map = None  # (index in the new vocabulary, index in the source's) of the shared tokens
    if dst_vocab is not None:
        if not drafter.vocab_ready and dst_vocab.numel() == src_vocab.numel():
            drafter.set_draft_vocab(src_vocab)
            vocab = f"the source's {src_vocab.numel()} tokens"
        if not drafter.vocab_ready:
            raise UsageError("model.init_from: choose this run's draft vocabulary first (fit does it from its data)")
        if not torch.equal(drafter.draft_vocab.cpu(), src_vocab.cpu()):
            src_index = {int(t): i for i, t in enumerate(src_vocab.tolist())}
            pairs = [(i, src_index[int(t)]) for i, t in enumerate(drafter.draft_vocab.tolist()) if int(t) in src_index]
            row_map = torch.tensor(pairs, dtype=torch.long).reshape(-1, 2)
            vocab = (f"this run's {dst_vocab.numel()} tokens, {len(pairs)} of them in the source's "
                     f"{src_vocab.numel()}")  # fmt: skip
    src_state = source.state_dict()
    copied, remapped, fresh = [], [], []
    for name, t in drafter.state_dict().items():
        if name == "draft_vocab":
            continue
        s = src_state.get(name)
        if s is not None and s.shape == t.shape and (row_map is None or dst_vocab.numel() not in t.shape):
            t.copy_(s.to(t))
            copied.append(name)
        elif s is not None and row_map is not None and s.dim() == t.dim() and _vocab_axis(t, s, dst_vocab, src_vocab):
            ax = _vocab_axis(t, s, dst_vocab, src_vocab) - 1
            t.index_copy_(ax, row_map[:, 0].to(t.device), s.index_select(ax, row_map[:, 1]).to(t))
            remapped.append(name)
        else:
            fresh.append(name)
    return Reuse(copied, remapped, fresh, vocab)


def _vocab_axis(t: torch.Tensor, s: torch.Tensor, dst_vocab: torch.Tensor, src_vocab: torch.Tensor) -> int:
    """1 + the axis along which ``t`` and ``s`` differ only by their draft-vocabulary sizes (0: none)."""
    diff = [i for i, (a, b) in enumerate(zip(t.shape, s.shape, strict=True)) if a != b or a == dst_vocab.numel()]
    if len(diff) == 1 and t.shape[diff[0]] == dst_vocab.numel() and s.shape[diff[0]] == src_vocab.numel():
        return diff[0] + 1
    return 0
