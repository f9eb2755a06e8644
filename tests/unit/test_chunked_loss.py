"""The chunked loss equals the unchunked one (values and gradients), on the tiny target's LM head."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from dspark_lightning import load_target
from dspark_lightning.losses import ProjectedLogits, dspark_loss, position_weights

N, G = 11, 4  # anchor blocks (not a multiple of the chunk sizes below), γ


def reference_loss(logits, target_logits, labels, mask, weights, conf_logits, ce_w, l1_w, conf_w, soft_w):
    """The loss as it was before chunking (commit 3c44911), verbatim but for the LossTerms container."""
    vw = mask * weights.to(mask)
    z = vw.sum().clamp_min(1e-8)
    logp = F.log_softmax(logits.float(), dim=-1)
    ce_tok = -logp.gather(-1, labels[..., None]).squeeze(-1)
    in_vocab = torch.isfinite(ce_tok)
    ce_w_ = vw * in_vocab
    ce = (ce_w_ * ce_tok.where(in_vocab, 0.0)).sum() / ce_w_.sum().clamp_min(1e-8)
    zero = logits.new_zeros(())
    soft_ce = zero
    if target_logits is not None:
        p_d = logp.exp()
        p_t = F.softmax(target_logits.float(), dim=-1).detach()
        l1_tok = (p_d - p_t).abs().sum(-1)
        l1 = (vw * l1_tok).sum() / z
        acc = (1 - 0.5 * l1_tok).clamp(0, 1).detach()
        if soft_w:
            soft_ce = (vw * -(p_t * logp).sum(-1)).sum() / z
    else:
        l1, acc = zero, (labels == logits.argmax(-1)).float()
    conf = zero
    if conf_logits is not None:
        conf = (vw * F.binary_cross_entropy_with_logits(conf_logits.float(), acc, reduction="none")).sum() / z
    total = ce_w * ce + (l1_w * l1 if target_logits is not None else 0) + conf_w * conf + soft_w * soft_ce
    return {"total": total, "ce": ce, "l1": l1, "conf": conf, "soft_ce": soft_ce, "acc": acc}


@pytest.fixture(scope="module")
def case():
    """Draft logits from a trainable projection onto the tiny target's LM head, target logits from the head itself."""
    tgt = load_target("tiny-debug")
    V, d = tgt.geometry.vocab_size, tgt.geometry.hidden_size
    g = torch.Generator().manual_seed(0)
    return {
        "head": tgt.logits,
        "V": V,
        "h_draft": torch.randn(N, G, d, generator=g),
        "h_target": torch.randn(N, G, d, generator=g) * 3,
        "proj": torch.randn(d, d, generator=g) / d**0.5,
        "labels": torch.randint(0, V, (N, G), generator=g),
        "mask": (torch.rand(N, G, generator=g) > 0.2).float().cumprod(-1),
        "conf": torch.randn(N, G, generator=g),
        "vocab": torch.randperm(V, generator=g)[: V // 3].sort().values,
    }


def _inputs(case, reduced: bool):
    """Leaf parameters (projection, confidence logits) and the draft logits they give (-inf outside a subset)."""
    proj = case["proj"].clone().requires_grad_(True)
    conf = case["conf"].clone().requires_grad_(True)
    logits = case["head"](case["h_draft"] @ proj)  # (N, γ, V)
    if reduced:  # the drafter's full_logits: -inf outside the reduced draft vocabulary
        keep = torch.zeros(case["V"], dtype=torch.bool)
        keep[case["vocab"]] = True
        logits = logits.masked_fill(~keep, float("-inf"))
    return proj, conf, logits


WEIGHTS = {"default": (0.1, 0.9, 1.0, 0.0), "soft_ce": (0.5, 0.5, 1.0, 0.5)}


# the soft cross-entropy needs target logits: that combination is not a valid loss, so it is not generated
TARGET_WEIGHTS = [
    (t, w) for t in ("tensor", "projected", "none") for w in WEIGHTS if not (t == "none" and WEIGHTS[w][3])
]


@pytest.mark.parametrize("reduced", [False, True], ids=["full_vocab", "draft_vocab"])
@pytest.mark.parametrize("chunk_size", [1, 4, N])
@pytest.mark.parametrize(("target", "weights"), TARGET_WEIGHTS)
def test_chunked_loss_equals_the_unchunked_loss(case, reduced, weights, chunk_size, target):
    w = position_weights(G, 4.0)
    cw = WEIGHTS[weights]
    t_logits = None if target == "none" else case["head"](case["h_target"])
    args = (case["labels"], case["mask"], w)

    proj, conf, logits = _inputs(case, reduced)
    ref = reference_loss(logits, t_logits, *args, conf, *cw)
    ref_grads = torch.autograd.grad(ref["total"], (proj, conf))

    proj, conf, logits = _inputs(case, reduced)
    given = ProjectedLogits(case["h_target"], case["head"]) if target == "projected" else t_logits
    got = dspark_loss(logits, given, *args, conf, *cw, chunk_size=chunk_size)
    grads = torch.autograd.grad(got.total, (proj, conf))

    # The soft CE is not finite with a reduced draft vocabulary (log q = -inf where p_t > 0), before and after.
    nan = reduced and cw[3] > 0
    for name, value in ref.items():
        assert_close(getattr(got, name), value.float(), equal_nan=nan, msg=name)
    for name, a, b in zip(("projection", "confidence"), grads, ref_grads, strict=True):
        assert_close(a, b, equal_nan=nan, msg=f"gradient of {name}")
    assert torch.isfinite(got.total) != nan and not got.acc.requires_grad


def test_chunks_without_gradients_give_the_same_terms(case):
    """Validation runs under no_grad: chunks without checkpointing, same numbers."""
    w = position_weights(G, 4.0)
    with torch.no_grad():
        _, conf, logits = _inputs(case, True)
        t = ProjectedLogits(case["h_target"], case["head"])
        a = dspark_loss(logits, t, case["labels"], case["mask"], w, conf, chunk_size=3)
        b = dspark_loss(logits, t[:], case["labels"], case["mask"], w, conf, chunk_size=None)
    for name in ("total", "ce", "l1", "conf", "acc", "conf_prob"):
        assert_close(getattr(a, name), getattr(b, name), msg=name)
