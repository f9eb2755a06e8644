"""MoE + sliding-window backbone: router shapes, load balancing on hand-made cases, windowed context."""

import pytest
import torch

from dspark_lightning import create
from dspark_lightning.drafters import MoESWABackbone
from dspark_lightning.infer import SamplingParams, make_proposer
from dspark_lightning.layers import MoE, Router, block_attention_mask, moe_aux_loss, moe_loads


def test_router_top_k_shapes_and_weights():
    torch.manual_seed(0)
    r = Router(16, num_experts=6, top_k=2)
    idx, w, probs, load = r(torch.randn(10, 16))
    assert idx.shape == (10, 2) and w.shape == (10, 2) and probs.shape == (10, 6) and load.shape == (6,)
    assert (idx[:, 0] != idx[:, 1]).all()
    assert torch.allclose(w.sum(-1), torch.ones(10)) and torch.isclose(load.sum(), torch.tensor(1.0))
    with pytest.raises(ValueError, match="top_k"):
        Router(16, 4, 5)


def skewed_moe(balance: str) -> MoE:
    """4 experts, top-1; the gate prefers expert 0 for every input with a positive first feature."""
    m = MoE(4, 8, num_experts=4, top_k=1, balance=balance, bias_rate=0.05)
    with torch.no_grad():
        m.router.gate.weight.zero_()
        m.router.gate.weight[0, 0] = 2.0
    return m


def test_aux_loss_and_load_on_a_hand_made_case():
    x = torch.zeros(8, 4)
    x[:, 0] = 1.0  # everything routes to expert 0
    m = skewed_moe("aux")
    m(x)
    assert moe_loads(m)[0].tolist() == [1.0, 0.0, 0.0, 0.0]
    p0 = torch.softmax(torch.tensor([2.0, 0, 0, 0]), 0)[0]
    assert torch.isclose(moe_aux_loss(m), 4 * p0)  # E * f_0 * P_0 with f_0 = 1
    m(torch.zeros(8, 4))  # uniform router probabilities: E * sum_i f_i / E = 1 however ties are routed
    assert torch.isclose(moe_aux_loss(m), torch.tensor(1.0))


def test_aux_loss_gradient_pushes_probability_off_the_overloaded_expert():
    x = torch.zeros(8, 4)
    x[:, 0] = 1.0
    m = skewed_moe("aux")
    m(x)
    moe_aux_loss(m).backward()
    assert m.router.gate.weight.grad[0, 0] > 0  # gradient descent lowers expert 0's logit


def test_bias_balancing_spreads_the_load():
    torch.manual_seed(0)
    x = torch.randn(64, 4)
    x[:, 0] = x[:, 0].abs() + 0.5
    m = MoE(4, 8, num_experts=4, top_k=1, balance="bias", bias_rate=0.01).train()
    with torch.no_grad():
        m.router.gate.weight.normal_(0, 0.3)
        m.router.gate.weight[0, 0] = 2.0  # expert 0 takes almost everything at first
    m(x)
    assert moe_loads(m)[0][0] > 0.9
    late = []
    for i in range(150):
        m(x)
        late += [moe_loads(m)[0].max().item()] if i >= 100 else []
    assert moe_aux_loss(m) is None  # no auxiliary loss in bias mode
    assert sum(late) / len(late) < 0.45 and m.router.bias[0] < 0 < m.router.bias[1]
    m.eval()
    before = m.router.bias.clone()
    m(x)
    assert torch.equal(m.router.bias, before)  # biases move only in training


def test_backbone_layer_windows_and_validation(tiny_target):
    g = tiny_target.geometry
    bb = MoESWABackbone(g, num_layers=3, layer_types=["sliding", "full", "sliding"], sliding_window=4, num_experts=4)
    assert bb.layer_windows == [4, None, 4]
    with pytest.raises(ValueError, match="layer_types"):
        MoESWABackbone(g, num_layers=2, layer_types=["sliding"])


def test_sliding_window_mask_equals_hand_written():
    T, F = True, False
    m = block_attention_mask(torch.tensor([[5]]), torch.tensor([[True]]), 8, 2, window=3)
    assert m[0].tolist() == [[F, F, T, T, T, F, F, F, T, T]] * 2  # context 2..4 = a-3..a-1, then its own block


def _moe_drafter(target, window, types=None):
    torch.manual_seed(0)
    bb = {
        "class_path": "moe_swa",
        "init_args": {"num_layers": 2, "sliding_window": window, "num_experts": 4, "layer_types": types},
    }
    return create("drafter", "dspark", target, block_size=3, backbone=bb).eval()


@pytest.mark.parametrize("where", ["train", "infer"])
def test_window_limits_which_context_a_block_sees(tiny_target, tiny_batch, where):
    """Anchor at 12, window 4: context 8..11 matters, context 0..7 does not (both training and decoding)."""
    context, _, ids = tiny_batch
    d = _moe_drafter(tiny_target, window=4)
    a = 12

    def block_logits(ctx):
        if where == "train":
            with torch.no_grad():
                return d(ctx[:1], ids[:1], torch.tensor([[a]]), torch.tensor([[True]])).logits[0, 0]
        prop = make_proposer(d)
        prop.add([0])
        prop.extend([0], ctx[:1, :a], torch.tensor([0]), torch.tensor([a]))
        tf = ids[:1, a + 1 : a + 4]
        return prop.propose([0], ids[0, a : a + 1], torch.tensor([a]), SamplingParams(1.0), teacher_tokens=tf).logits[0]

    base = block_logits(context)
    far = context.clone()
    far[:, :8] += 3.0
    assert torch.allclose(base, block_logits(far), atol=1e-5)
    near = context.clone()
    near[:, 9] += 3.0
    assert not torch.allclose(base, block_logits(near), atol=1e-5)
    d = _moe_drafter(tiny_target, window=4, types=["sliding", "full"])  # one full layer sees everything
    assert not torch.allclose(block_logits(context), block_logits(far), atol=1e-5)
