import math

import pytest
import torch
import torch.nn.functional as F

from dspark_lightning.data.features.anchors import AnchorCollator, eligible_anchors, sample_anchors
from dspark_lightning.losses import dspark_loss, expected_tau, position_weights, supervision_mask


def test_anchor_eligibility_hand_made():
    #                 prompt     | response 1  |glue| response 2
    lm = torch.tensor([0, 0, 0, 1, 1, 1, 0, 0, 1, 1])
    # t eligible iff lm[t] = lm[t+1] = 1 and t <= S-2: never the last prompt token (2) nor the last token (9)
    assert eligible_anchors(lm).tolist() == [3, 4, 8]


def test_sample_anchors_sorted_capped_and_padded():
    lm = torch.tensor([0] * 3 + [1] * 40)
    a, v = sample_anchors(lm, 8, torch.Generator().manual_seed(1))
    assert v.all() and a.tolist() == sorted(a.tolist()) and len(set(a.tolist())) == 8
    assert all(3 <= x <= 41 for x in a.tolist())
    a, v = sample_anchors(torch.tensor([0, 1, 1, 1]), 5, torch.Generator().manual_seed(1))
    assert v.tolist() == [True, True, False, False, False] and a[:2].tolist() == [1, 2]


def test_collator_is_reproducible_per_epoch_and_id():
    s = [{"id": "a", "input_ids": list(range(30)), "loss_mask": [0] * 5 + [1] * 25}]
    c = AnchorCollator(4, seed=7)
    first, again = c(s)["anchors"], c(s)["anchors"]
    c.epoch = 1
    assert torch.equal(first, again) and not torch.equal(first, c(s)["anchors"])


def test_supervision_mask_is_a_prefix_that_stops_at_turn_boundaries():
    lm = torch.tensor([[0, 1, 1, 1, 0, 1, 1, 1]])
    v = supervision_mask(torch.tensor([[1, 2, 6]]), torch.tensor([[True, True, True]]), lm, 3)
    # anchor 1: labels at 2,3,4 -> 1,1,0 ; anchor 2: labels 3,4,5 -> 1,0,(1 cut) ; anchor 6: label 7, then past S
    assert v[0].tolist() == [[1, 1, 0], [1, 0, 0], [1, 0, 0]]


def test_position_weights():
    w = position_weights(7, 4.0)
    assert torch.allclose(w, torch.tensor([1, 0.7788, 0.6065, 0.4724, 0.3679, 0.2865, 0.2231]), atol=1e-4)
    assert torch.equal(position_weights(3, None), torch.ones(3))


def test_loss_by_hand():
    """V = 3, γ = 2, one block; position 2 masked out in the second block."""
    z = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]], [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]], requires_grad=True)
    zt = torch.tensor([[[0.0, 1.0, 0.0], [0.0, 2.0, 0.0]], [[2.0, 0.0, 0.0], [0.0, 0.0, 0.0]]])
    labels = torch.tensor([[0, 1], [2, 0]])
    v = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    w = torch.tensor([1.0, math.exp(-1 / 4)])
    conf = torch.tensor([[0.5, -0.5], [0.0, 3.0]], requires_grad=True)
    t = dspark_loss(z, zt, labels, v, w, conf, 0.1, 0.9, 1.0)

    pd, pt = F.softmax(z.detach(), -1), F.softmax(zt, -1)
    vw = [(0, 0, 1.0), (0, 1, w[1].item()), (1, 0, 1.0)]
    Z = sum(x for *_, x in vw)
    ce = sum(x * -math.log(pd[b, k, labels[b, k]]) for b, k, x in vw) / Z
    l1 = sum(x * (pd[b, k] - pt[b, k]).abs().sum().item() for b, k, x in vw) / Z
    cstar = torch.minimum(pd, pt).sum(-1)
    bce = sum(x * F.binary_cross_entropy_with_logits(conf[b, k].detach(), cstar[b, k]).item() for b, k, x in vw) / Z
    assert t.ce.item() == pytest.approx(ce, rel=1e-5)
    assert t.l1.item() == pytest.approx(l1, rel=1e-5)
    assert t.conf.item() == pytest.approx(bce, rel=1e-5)
    assert t.total.item() == pytest.approx(0.1 * ce + 0.9 * l1 + bce, rel=1e-5)
    assert torch.allclose(t.acc, cstar, atol=1e-6)  # c* = Σ min(p_d, p_t) = 1 - ½‖p_d - p_t‖₁
    assert not t.acc.requires_grad  # c* is detached: no gradient reaches the label
    # the BCE term alone sends no gradient into the draft logits
    dz = torch.autograd.grad(dspark_loss(z, zt, labels, v, w, conf, 0.0, 0.0, 1.0).total, z, allow_unused=True)[0]
    assert dz is None or dz.abs().max() == 0
    # the greedy label (T = 0 serving): 1 where the argmaxes agree, here (0 vs 1, 1 vs 1, 0 vs 0)
    greedy = dspark_loss(z, zt, labels, v, w, conf, 0.0, 0.0, 1.0, conf_label="greedy")
    agree = torch.tensor([[0.0, 1.0], [1.0, 1.0]])
    bce = sum(x * F.binary_cross_entropy_with_logits(conf[b, k].detach(), agree[b, k]).item() for b, k, x in vw) / Z
    assert greedy.conf.item() == pytest.approx(bce, rel=1e-5)


def test_expected_tau():
    assert expected_tau(torch.tensor([1.0, 1.0, 1.0])) == pytest.approx(4.0)
    assert expected_tau(torch.tensor([0.5, 0.5])) == pytest.approx(1 + 0.5 + 0.25)


def test_tau_hat_averages_per_block_products():
    """Blocks [1, 1] and [0, 0]: expected lengths 3 and 1, τ̂ = 2; the product of position means would say 1.75."""
    from dspark_lightning.lightning.metrics import PositionAcceptance

    m = PositionAcceptance(2, ["math"])
    acc = torch.tensor([[1.0, 1.0], [0.0, 0.0], [0.9, 0.9]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [0.0, 0.0]])  # the third block is not supervised: not counted
    m.update(acc, mask, ["math", "math", "math"])
    num, den, tau_sum, blocks = m.compute()
    assert float(tau_sum[-1] / blocks[-1]) == pytest.approx(2.0)
    assert expected_tau(num[-1] / den[-1]) == pytest.approx(1.75)  # the biased estimate this replaces
    m.update(torch.tensor([[1.0, 1.0]]), torch.tensor([[1.0, 0.0]]), ["math"])  # truncated: 1 + 1 = 2
    _, _, tau_sum, blocks = m.compute()
    assert float(tau_sum[-1] / blocks[-1]) == pytest.approx((3 + 1 + 2) / 3)
