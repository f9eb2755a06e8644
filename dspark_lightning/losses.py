"""DSpark training losses (SPEC §4, paper Eq. 9-12). Pure functions on tensors.

    L = ce_weight * L_ce + l1_weight * L_l1 + conf_weight * L_conf      (default 0.1 / 0.9 / 1.0)
      (+ soft_ce_weight * softCE(p_t, q), EAGLE-3's loss; 0 by default)

with per-position weights w_k = exp(-(k-1)/λ) and the supervision mask v; every term is a
weighted mean Σ v·w·term / Σ v·w over the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


def position_weights(block_size: int, decay: float | None = 4.0) -> torch.Tensor:
    """w_k = exp(-(k-1)/decay) for k = 1..γ; ``None`` means uniform weights."""
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
class LossTerms:
    total: torch.Tensor
    ce: torch.Tensor
    l1: torch.Tensor
    conf: torch.Tensor  # 0 without a confidence head
    soft_ce: torch.Tensor  # -Σ_v p_t log q (0 unless weighted)
    acc: torch.Tensor  # (N, γ) analytic acceptance c* = Σ_v min(p_d, p_t), detached
    conf_prob: torch.Tensor | None  # (N, γ) sigmoid(confidence logits), detached


def dspark_loss(
    logits: torch.Tensor,  # (N, γ, V) final draft logits z_k (-inf outside a reduced draft vocabulary)
    target_logits: torch.Tensor | None,  # (N, γ, V) target logits for the same positions (None: CE only)
    labels: torch.Tensor,  # (N, γ) data tokens x_{a+k}
    mask: torch.Tensor,  # (N, γ) supervision mask v
    weights: torch.Tensor,  # (γ,) position weights w
    conf_logits: torch.Tensor | None = None,  # (N, γ)
    ce_weight: float = 0.1,
    l1_weight: float = 0.9,
    conf_weight: float = 1.0,
    soft_ce_weight: float = 0.0,
) -> LossTerms:
    vw = mask * weights.to(mask)  # (N, γ)
    z = vw.sum().clamp_min(1e-8)
    logp = F.log_softmax(logits.float(), dim=-1)  # (N, γ, V) fp32, computed once
    ce_tok = -logp.gather(-1, labels[..., None]).squeeze(-1)  # (N, γ)
    # A reduced draft vocabulary gives -inf logits outside it: such labels cannot be predicted and leave the CE
    # (their mass still counts in L1 and c*, as rejected mass).
    in_vocab = torch.isfinite(ce_tok)
    ce_w = vw * in_vocab
    ce = (ce_w * ce_tok.where(in_vocab, 0.0)).sum() / ce_w.sum().clamp_min(1e-8)
    zero = logits.new_zeros(())
    soft_ce = zero
    if target_logits is not None:
        p_d = logp.exp()
        p_t = F.softmax(target_logits.float(), dim=-1).detach()
        l1_tok = (p_d - p_t).abs().sum(-1)  # (N, γ) full L1 = 2 TV, gradient through p_d only
        l1 = (vw * l1_tok).sum() / z
        acc = (1 - 0.5 * l1_tok).clamp(0, 1).detach()  # c* = Σ min(p_d, p_t)
        if soft_ce_weight:
            soft_ce = (vw * -(p_t * logp).sum(-1)).sum() / z
    else:
        if soft_ce_weight:
            raise ValueError("the soft cross-entropy needs the target logits")
        l1, acc = zero, (labels == logits.argmax(-1)).float()
    conf, conf_prob = zero, None
    if conf_logits is not None:
        bce = F.binary_cross_entropy_with_logits(conf_logits.float(), acc, reduction="none")
        conf = (vw * bce).sum() / z
        conf_prob = torch.sigmoid(conf_logits.detach().float())
    total = ce_weight * ce + (l1_weight * l1 if target_logits is not None else 0) + conf_weight * conf
    total = total + soft_ce_weight * soft_ce
    return LossTerms(total=total, ce=ce, l1=l1, conf=conf, soft_ce=soft_ce, acc=acc, conf_prob=conf_prob)


def expected_tau(acc_per_position: torch.Tensor) -> float:
    """τ̂ = 1 + Σ_k Π_{i<=k} acc_i from per-position (conditional) acceptances (γ,)."""
    return 1.0 + float(torch.cumprod(acc_per_position.double(), 0).sum())
