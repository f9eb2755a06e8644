"""The loss in the draft-vocabulary space equals the full-vocabulary loss: values, c*, TF-A and gradients."""

from __future__ import annotations

import pytest
import torch

from dspark_lightning.losses import dspark_loss

V, N, G, ROWS = 97, 23, 4, 6


def _case(seed: int, label_outside: bool):
    g = torch.Generator().manual_seed(seed)
    vocab = torch.randperm(V, generator=g)[:N].sort().values
    draft = torch.randn(ROWS, G, N, generator=g) * 2
    target = torch.randn(ROWS, G, V, generator=g) * 3
    target[..., vocab] += 1.5  # most of the target's mass on the draft vocabulary, not all of it
    labels = vocab[torch.randint(0, N, (ROWS, G), generator=g)]
    if label_outside:  # some data tokens the draft vocabulary cannot propose
        outside = torch.tensor(sorted(set(range(V)) - set(vocab.tolist())))
        labels[0, 1], labels[2, 3] = outside[0], outside[5]
    mask = (torch.rand(ROWS, G, generator=g) > 0.2).float().cumprod(-1)
    weights = torch.exp(-torch.arange(G) / 4.0)
    conf = torch.randn(ROWS, G, generator=g)
    return vocab, draft, target, labels, mask, weights, conf


def _inv(vocab):
    inv = torch.full((V,), -1, dtype=torch.long)
    inv[vocab] = torch.arange(N)
    return inv


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("label_outside", [False, True])
@pytest.mark.parametrize("top_ce", [0.0, 0.5])
def test_subset_loss_equals_full(seed, label_outside, top_ce):
    vocab, draft, target, labels, mask, weights, conf = _case(seed, label_outside)
    # full vocabulary: draft logits expanded with -inf outside the subset, target logits over V
    z_full = draft.clone().requires_grad_(True)
    full_logits = torch.full((ROWS, G, V), float("-inf")).index_copy(-1, vocab, z_full)
    full = dspark_loss(full_logits, target, labels, mask, weights, conf, top_ce_weight=top_ce)
    full.total.backward()
    # draft-vocabulary space: N columns both sides, the full log-sum-exp and argmax given
    z_sub = draft.clone().requires_grad_(True)
    inv = _inv(vocab)
    lse = torch.logsumexp(target, -1)
    top = inv[target.argmax(-1)]
    sub = dspark_loss(z_sub, target[..., vocab], inv[labels], mask, weights, conf, target_lse=lse, target_top=top,
                      top_ce_weight=top_ce)  # fmt: skip
    sub.total.backward()
    for name in ("total", "ce", "l1", "conf", "top_ce"):
        torch.testing.assert_close(getattr(sub, name), getattr(full, name), rtol=1e-5, atol=1e-6, msg=name)
    torch.testing.assert_close(sub.acc, full.acc, rtol=1e-5, atol=1e-6)
    assert torch.equal(sub.agree, full.agree)
    torch.testing.assert_close(z_sub.grad, z_full.grad, rtol=1e-5, atol=1e-7)
    # the mass outside the subset is real: the L1 is larger than the one over the subset alone
    p_sub = torch.softmax(target, -1)[..., vocab]
    l1_inside = (torch.softmax(draft, -1) - p_sub).abs().sum(-1)
    assert bool((sub.acc < 1 - 0.5 * l1_inside + 1e-6).all()) and bool((p_sub.sum(-1) < 1 - 1e-3).all())


def test_agreement_is_argmax_match():
    vocab, draft, target, labels, mask, weights, conf = _case(3, False)
    inv = _inv(vocab)
    top = inv[target.argmax(-1)]
    draft[0, 0] = -10.0
    if top[0, 0] >= 0:
        draft[0, 0, top[0, 0]] = 10.0  # slot agrees with the target's argmax
    t = dspark_loss(draft, target[..., vocab], inv[labels], mask, weights, target_lse=torch.logsumexp(target, -1),
                    target_top=top)  # fmt: skip
    expect = (draft.argmax(-1) == top).float()
    assert torch.equal(t.agree, expect)
    assert float(t.agree[0, 0]) == float(top[0, 0] >= 0)


def test_subset_needs_the_argmax():
    vocab, draft, target, labels, mask, weights, _ = _case(4, False)
    with pytest.raises(ValueError, match="argmax"):
        dspark_loss(draft, target[..., vocab], _inv(vocab)[labels], mask, weights,
                    target_lse=torch.logsumexp(target, -1))  # fmt: skip
