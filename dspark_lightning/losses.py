"""DSpark training losses (docs/algorithm.md §4, paper Eq. 9-12). Pure functions on tensors.

    L = ce_weight * L_ce + l1_weight * L_l1 + conf_weight * L_conf      (default 0.1 / 0.9 / 1.0)
      (+ soft_ce_weight * softCE(p_t, q), EAGLE-3's loss; 0 by default)

with per-position weights w_k = exp(-(k-1)/λ) and the supervision mask v; every term is a
weighted mean Σ v·w·term / Σ v·w over the batch.

Memory. The per-token terms need several fp32 (rows × V) tensors (log q, q, p_t, |q - p_t|, and their gradients),
which at 512 anchors, γ = 7 and V = 151,936 is tens of GB. :func:`dspark_loss` therefore works on ``chunk_size``
anchor blocks at a time, each chunk under :func:`torch.utils.checkpoint.checkpoint`: the forward keeps only the
(N, γ) per-token results, and the backward recomputes one chunk's fp32 tensors at a time. Target logits given as
:class:`ProjectedLogits` are projected per chunk too, so the (N·γ × V) target logits never exist at once. With
N anchor blocks, c = chunk_size, b the byte width of the draft logits and b_t of the target logits, the loss's
own peak (on top of the draft logits (N·γ·V·b) that the drafter already holds) is about

    unchunked:  N·γ·V·(b_t + 4·k)          k ≈ 5 fp32 tensors alive at the end of the forward
    chunked:    N·γ·V·2·b + c·γ·V·(b_t + 4·k)   (2·b: the logits' gradient, gathered once, in the backward)

measured in docs/training.md. The vocabulary is not chunked: one anchor block's fp32 row (γ·V·4 B, 4.3 MB at
γ = 7, V = 151,936) is already small. Chunking changes no value: each row's terms are computed by the same ops,
and the reductions run over the same (N, γ) tensors (tests/unit/test_chunked_loss.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .checks import UsageError


def position_weights(block_size: int, decay: float | None = 4.0) -> torch.Tensor:
    """w_k = exp(-(k-1)/decay) for k = 1..γ; ``None`` means uniform weights.

    ``decay`` must be finite and > 0: 0 would make w_1 = exp(0/0) = NaN (and the loss NaN), a negative one grows."""
    if decay is not None and not (math.isfinite(decay) and decay > 0):
        raise UsageError(f"loss decay must be finite and > 0 (null = uniform weights), got {decay}")
    k = torch.arange(block_size, dtype=torch.float32)
    return torch.ones(block_size) if decay is None else torch.exp(-k / decay)


def supervision_mask(
    anchors: torch.Tensor,  # (B, A)
    valid: torch.Tensor,  # (B, A) bool
    loss_mask: torch.Tensor,  # (B, S) 1 on response tokens
    block_size: int,
) -> torch.Tensor:
    """v (B, A, γ): slot k of anchor a (label x_{a+k}) is supervised iff a+k < S and loss_mask[a+k] = 1,
    made a contiguous prefix by a cumulative product over k (stops at turn boundaries); 0 for dummies."""
    B, S = loss_mask.shape
    idx = anchors[:, :, None] + torch.arange(1, block_size + 1, device=anchors.device)  # (B, A, γ)
    inside = idx < S
    lm = torch.gather(loss_mask.float(), 1, idx.clamp(max=S - 1).view(B, -1)).view_as(idx) * inside
    return torch.cumprod(lm, dim=-1) * valid[:, :, None].float()


@dataclass
class ProjectedLogits:
    """Target logits computed on demand, ``head(hidden[rows])`` without gradient, so a chunked loss never holds
    all (N·γ × V) of them. Sliced along dim 0 like the (N, γ, V) tensor it stands for."""

    hidden: torch.Tensor  # (N, γ, d) target final-norm hidden states at the supervised positions
    head: Callable[[torch.Tensor], torch.Tensor]  # (..., d) -> (..., V), the target's LM head

    def __len__(self) -> int:
        return self.hidden.shape[0]

    def __getitem__(self, rows: slice) -> torch.Tensor:
        with torch.no_grad():
            return self.head(self.hidden[rows])


@dataclass
class LossTerms:
    total: torch.Tensor
    ce: torch.Tensor
    l1: torch.Tensor
    conf: torch.Tensor  # 0 without a confidence head
    soft_ce: torch.Tensor  # -Σ_v p_t log q (0 unless weighted)
    acc: torch.Tensor  # (N, γ) analytic acceptance c* = Σ_v min(p_d, p_t), detached
    conf_prob: torch.Tensor | None  # (N, γ) sigmoid(confidence logits), detached
    agree: torch.Tensor | None = None  # (N, γ) 1 where argmax q = argmax p_t (teacher-forced T = 0 acceptance)
    top_ce: torch.Tensor | None = None  # CE to the target's argmax token (0 unless weighted)


def _token_terms(
    logits: torch.Tensor,  # (n, γ, N) over the draft vocabulary (N = V without one)
    target_logits: torch.Tensor | None,  # (n, γ, N) target logits of the same N tokens
    labels: torch.Tensor,  # (n, γ) indices into the N tokens, -1 = outside them (no CE)
    soft_ce: bool,
    target_lse: torch.Tensor | None = None,  # (n, γ) full-vocabulary log-sum-exp of the target logits
    target_top: torch.Tensor | None = None,  # (n, γ) full-vocabulary target argmax as an index (-1 = outside)
    top_labels: bool = False,
) -> tuple[torch.Tensor, ...]:
    """Per-token terms of one chunk, in fp32: (-log q(x*), ‖q - p_t‖₁, -Σ p_t log q, c*, top-1 agreement,
    -log q(argmax p_t)), each (n, γ). Without target logits the L1 and soft CE are zeros and c* is the top-1 hit.

    Draft-vocabulary space: with ``target_lse`` the target logits cover only the N draft tokens, and
    p_t = exp(t - lse) there; the target mass outside them, 1 - Σ_N p_t, is added to the L1 exactly (q is 0 there),
    so the L1, c* = 1 - L1/2 and their gradients equal the full-vocabulary computation."""
    logp = F.log_softmax(logits.float(), dim=-1)  # (n, γ, N) fp32
    ce_tok = _nll(logp, labels)  # (n, γ), inf for labels outside the draft vocabulary
    draft_top = logp.argmax(-1)
    if target_logits is None:
        zero = ce_tok.new_zeros(ce_tok.shape)
        hit = (labels == draft_top).float()
        return ce_tok, zero, zero, hit, hit, zero
    t = target_logits.float()
    if target_lse is None:
        p_t = F.softmax(t, dim=-1).detach()
        outside = 0.0
        if target_top is None:
            target_top = t.argmax(-1)
    else:
        if target_top is None:
            raise UsageError("draft-vocabulary target logits need the full-vocabulary argmax too")
        p_t = torch.exp(t - target_lse.float()[..., None]).detach()
        outside = (1 - p_t.sum(-1)).clamp_min(0)  # target mass the draft vocabulary cannot propose
    l1_tok = (logp.exp() - p_t).abs().sum(-1) + outside  # (n, γ) full L1 = 2 TV, gradient through p_d only
    soft_tok = -(p_t * logp).sum(-1) if soft_ce else torch.zeros_like(l1_tok)
    acc = (1 - 0.5 * l1_tok).clamp(0, 1).detach()  # c* = Σ min(p_d, p_t)
    agree = (draft_top == target_top).float()  # greedy (T = 0) acceptance, teacher-forced
    top_tok = _nll(logp, target_top) if top_labels else torch.zeros_like(l1_tok)
    return ce_tok, l1_tok, soft_tok, acc, agree, top_tok


def _nll(logp: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """-log q(label) (n, γ); inf where the label is -1 (outside the draft vocabulary) or has q = 0."""
    out = -logp.gather(-1, labels.clamp_min(0)[..., None]).squeeze(-1)
    return out.masked_fill(labels < 0, float("inf"))


def chunked_token_terms(
    logits: torch.Tensor,  # (N, γ, V)
    target_logits: torch.Tensor | ProjectedLogits | None,  # (N, γ, V)
    labels: torch.Tensor,  # (N, γ)
    soft_ce: bool,
    chunk_size: int | None,
    target_lse: torch.Tensor | None = None,  # (N, γ)
    target_top: torch.Tensor | None = None,  # (N, γ)
    top_labels: bool = False,
) -> tuple[torch.Tensor, ...]:
    """:func:`_token_terms` over ``chunk_size`` rows at a time (None: all at once), concatenated to (N, γ) each.

    With gradients on, each chunk runs under activation checkpointing, so its fp32 (chunk·γ × V) tensors are
    freed after the forward and rebuilt one chunk at a time in the backward. ``split`` (one autograd node) gives
    the logits' gradient as a single concatenation of the chunks' gradients."""
    n = logits.shape[0]
    size = n if chunk_size is None else max(1, min(chunk_size, n))
    checkpointed = torch.is_grad_enabled() and logits.requires_grad and size < n
    parts = []
    for i, z in enumerate(logits.split(size)):
        rows = slice(i * size, i * size + z.shape[0])

        def terms(z: torch.Tensor, rows: slice = rows) -> tuple[torch.Tensor, ...]:
            t = None if target_logits is None else target_logits[rows]
            lse = None if target_lse is None else target_lse[rows]
            top = None if target_top is None else target_top[rows]
            return _token_terms(z, t, labels[rows], soft_ce, lse, top, top_labels)

        parts.append(checkpoint(terms, z, use_reentrant=False) if checkpointed else terms(z))
    return tuple(torch.cat(ts) for ts in zip(*parts, strict=True))


def dspark_loss(
    logits: torch.Tensor,  # (N, γ, V) final draft logits z_k (-inf outside a reduced draft vocabulary)
    target_logits: torch.Tensor | ProjectedLogits | None,  # (N, γ, V) target logits for the same positions
    labels: torch.Tensor,  # (N, γ) data tokens x_{a+k}
    mask: torch.Tensor,  # (N, γ) supervision mask v
    weights: torch.Tensor,  # (γ,) position weights w
    conf_logits: torch.Tensor | None = None,  # (N, γ)
    ce_weight: float = 0.1,
    l1_weight: float = 0.9,
    conf_weight: float = 1.0,
    soft_ce_weight: float = 0.0,
    chunk_size: int | None = None,
    target_lse: torch.Tensor | None = None,  # (N, γ) full-vocabulary log-sum-exp (draft-vocabulary space)
    target_top: torch.Tensor | None = None,  # (N, γ) full-vocabulary target argmax, as an index into the logits
    top_ce_weight: float = 0.0,
    conf_label: str = "analytic",
) -> LossTerms:
    """The loss terms; ``target_logits`` None trains with the CE only. ``chunk_size``: anchor blocks per chunk of
    the per-token terms (None: one chunk), which bounds memory and changes no value (module docstring).

    Draft-vocabulary space: ``logits`` and ``target_logits`` may cover only the N draft tokens (labels then index
    them, -1 = outside), with ``target_lse`` and ``target_top`` computed over the whole vocabulary; every term
    equals the full-vocabulary one (tests/unit/test_subset_loss.py). ``top_ce_weight``: weight of a CE to the
    target's argmax token (the greedy label, free from the target logits). ``conf_label``: what the confidence head
    learns, ``analytic`` (c*, the T = 1 acceptance) or ``greedy`` (the top-1 agreement, the T = 0 event)."""
    if target_logits is None and soft_ce_weight:
        raise UsageError("the soft cross-entropy needs the target logits")
    vw = mask * weights.to(mask)  # (N, γ)
    z = vw.sum().clamp_min(1e-8)
    if top_ce_weight and target_logits is None:
        raise UsageError("the argmax cross-entropy needs the target logits")
    ce_tok, l1_tok, soft_tok, acc, agree, top_tok = chunked_token_terms(
        logits, target_logits, labels, bool(soft_ce_weight), chunk_size, target_lse, target_top, bool(top_ce_weight)
    )
    # A reduced draft vocabulary gives -inf logits outside it: such labels cannot be predicted and leave the CE
    # (their mass still counts in L1 and c*, as rejected mass).
    in_vocab = torch.isfinite(ce_tok)
    ce_w = vw * in_vocab
    ce = (ce_w * ce_tok.where(in_vocab, 0.0)).sum() / ce_w.sum().clamp_min(1e-8)
    zero = logits.new_zeros((), dtype=torch.float32)
    l1 = zero if target_logits is None else (vw * l1_tok).sum() / z
    soft_ce = (vw * soft_tok).sum() / z if soft_ce_weight else zero
    conf, conf_prob = zero, None
    if conf_logits is not None:
        label = acc if conf_label == "analytic" else agree  # Σ min(p_d, p_t), or the greedy event 1[argmaxes agree]
        bce = F.binary_cross_entropy_with_logits(conf_logits.float(), label, reduction="none")
        conf = (vw * bce).sum() / z
        conf_prob = torch.sigmoid(conf_logits.detach().float())
    total = ce_weight * ce + (l1_weight * l1 if target_logits is not None else 0) + conf_weight * conf
    top_ce = zero
    if top_ce_weight:
        top_w = vw * torch.isfinite(top_tok)
        top_ce = (top_w * top_tok.where(top_w > 0, 0.0)).sum() / top_w.sum().clamp_min(1e-8)
    total = total + soft_ce_weight * soft_ce + top_ce_weight * top_ce
    return LossTerms(
        total=total, ce=ce, l1=l1, conf=conf, soft_ce=soft_ce, acc=acc, conf_prob=conf_prob, agree=agree, top_ce=top_ce
    )


def expected_tau(acc_per_position: torch.Tensor) -> float:
    """τ̂ = 1 + Σ_k Π_{i<=k} acc_i from per-position (conditional) acceptances (γ,)."""
    return 1.0 + float(torch.cumprod(acc_per_position.double(), 0).sum())
