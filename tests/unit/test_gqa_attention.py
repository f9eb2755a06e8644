"""Grouped-query attention through the fused SDPA kernel (``enable_gqa``) equals the repeat_interleave version it
replaced: outputs and gradients, dense and sliding-window masks, dummy rows, num_kv_heads < num_heads."""

import pytest
import torch
import torch.nn.functional as F

from dspark_lightning import create
from dspark_lightning.layers import InjectedAttention, apply_rope, block_attention_mask, rope_cos_sin, transformer

ATOL = 1e-5


def old_forward(self, h, cos, sin, ctx_k, ctx_v, mask):
    """InjectedAttention.forward before the change: K/V repeated to every query head, then SDPA."""
    q = apply_rope(self.q_norm(self._heads(self.q_proj(h), self.num_heads)), cos, sin)
    k_blk, v_blk = self.kv(h, cos, sin)
    k = torch.cat([ctx_k, k_blk], dim=2)
    v = torch.cat([ctx_v, v_blk], dim=2)
    rep = self.num_heads // self.num_kv_heads
    if rep > 1:
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    live = mask.any(-1, keepdim=True)
    safe = mask | ~live
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=safe[:, None])
    out = out.transpose(1, 2).reshape(h.shape[0], h.shape[1], -1) * live
    return self.o_proj(out)


@pytest.fixture
def sdpa_calls(monkeypatch):
    """The key/value head counts and ``enable_gqa`` of every SDPA call made by layers/transformer.py."""
    transformer.sdpa_has_gqa()  # probed once, before the spy
    calls, sdpa = [], F.scaled_dot_product_attention

    def spy(q, k, v, *args, **kwargs):
        calls.append((q.shape[1], k.shape[1], kwargs.get("enable_gqa", False)))
        return sdpa(q, k, v, *args, **kwargs)

    monkeypatch.setattr(transformer.F, "scaled_dot_product_attention", spy)
    return calls


def _inputs(num_kv_heads: int, window: int | None, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    B, S, A, gamma, H, Dh, d = 2, 11, 3, 3, 4, 8, 32
    torch.manual_seed(seed)
    attn = InjectedAttention(d, H, num_kv_heads, Dh)
    h = torch.randn(B, A * gamma, d, generator=g, requires_grad=True)
    ctx = torch.randn(B, S, d, generator=g)
    pos = torch.arange(S)[None].expand(B, S)
    ctx_k, ctx_v = attn.kv(ctx, *rope_cos_sin(pos, Dh, 10000.0))
    ctx_k, ctx_v = ctx_k.detach().requires_grad_(), ctx_v.detach().requires_grad_()
    anchors = torch.tensor([[2, 5, 9], [4, 7, 0]])
    valid = torch.tensor([[True, True, True], [True, True, False]])  # one dummy block: rows that see nothing
    blk_pos = (anchors[:, :, None] + torch.arange(gamma)).flatten(1)
    cos, sin = rope_cos_sin(blk_pos, Dh, 10000.0)
    mask = block_attention_mask(anchors, valid, S, gamma, window)
    return attn, (h, cos, sin, ctx_k, ctx_v, mask)


def _run(attn, args, forward):
    for p in (*attn.parameters(), *args):
        if isinstance(p, torch.Tensor) and p.grad is not None:
            p.grad = None
    out = forward(attn, *args)
    out.square().sum().backward()
    grads = [args[0].grad, args[3].grad, args[4].grad, *(p.grad for p in attn.parameters())]
    return out.detach(), [g.clone() for g in grads]


@pytest.mark.parametrize("num_kv_heads", [1, 2])
@pytest.mark.parametrize("window", [None, 4], ids=["dense", "sliding"])
def test_fused_gqa_equals_repeat_interleave(num_kv_heads, window, sdpa_calls):
    attn, args = _inputs(num_kv_heads, window)
    new_out, new_grads = _run(attn, args, InjectedAttention.forward)
    old_out, old_grads = _run(attn, args, old_forward)
    assert torch.allclose(new_out, old_out, atol=ATOL)
    assert not new_out[1, -3:].any()  # the dummy block's rows stay zero
    for a, b in zip(new_grads, old_grads, strict=True):
        assert torch.allclose(a, b, atol=ATOL)
    if transformer.sdpa_has_gqa() and transformer._kernel_takes_gqa(*_qkvm(attn, args)):
        assert sdpa_calls[0] == (4, num_kv_heads, True)  # the kernel got the un-repeated K/V
    else:
        assert sdpa_calls[0] == (4, 4, False)


def _qkvm(attn, args):
    h, cos, sin, ctx_k, ctx_v, mask = args
    q = apply_rope(attn.q_norm(attn._heads(attn.q_proj(h), attn.num_heads)), cos, sin)
    k_blk, v_blk = attn.kv(h, cos, sin)
    return q, torch.cat([ctx_k, k_blk], 2), torch.cat([ctx_v, v_blk], 2), mask[:, None]


def test_repeat_fallback_without_enable_gqa(monkeypatch, sdpa_calls):
    """torch < 2.5 (no enable_gqa) or no fused kernel for grouped heads: K/V are repeated, same values."""
    attn, args = _inputs(2, 4)
    fused_out, fused_grads = _run(attn, args, InjectedAttention.forward)
    monkeypatch.setattr(transformer, "sdpa_has_gqa", lambda: False)
    out, grads = _run(attn, args, InjectedAttention.forward)
    assert sdpa_calls[-1] == (4, 4, False)
    assert torch.allclose(out, fused_out, atol=ATOL)
    assert all(torch.allclose(a, b, atol=ATOL) for a, b in zip(grads, fused_grads, strict=True))


def test_enable_gqa_is_detected_on_this_torch():
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    assert transformer.sdpa_has_gqa() == ((major, minor) >= (2, 5))
    if transformer.sdpa_has_gqa():  # the CPU kernel takes masked GQA here, so the test above exercises the fused path
        attn, args = _inputs(2, None)
        assert transformer._kernel_takes_gqa(*_qkvm(attn, args))


@pytest.mark.parametrize(
    "backbone",
    [
        {"class_path": "dense", "init_args": {"num_layers": 2}},
        {"class_path": "moe_swa", "init_args": {"num_layers": 2, "sliding_window": 5, "num_experts": 4}},
    ],
    ids=["dense", "moe_swa"],
)
def test_drafter_logits_and_gradients_unchanged(tiny_target, tiny_batch, backbone, monkeypatch):
    """A whole drafter (tiny target: 4 heads, 2 KV heads), new attention vs the old one: same logits and grads."""
    assert tiny_target.geometry.num_kv_heads < tiny_target.geometry.num_heads
    context, _, ids = tiny_batch
    anchors = torch.tensor([[2, 9, 15], [4, 11, 0]])
    valid = torch.tensor([[True, True, True], [True, True, False]])

    def run():
        torch.manual_seed(0)
        d = create("drafter", "dspark", tiny_target, block_size=4, backbone=backbone, seq_head="vanilla")
        out = d(context, ids, anchors, valid)
        out.logits.logsumexp(-1).mean().backward()
        return out.logits.detach(), {n: p.grad for n, p in d.named_parameters() if p.grad is not None}

    new_logits, new_grads = run()
    monkeypatch.setattr(InjectedAttention, "forward", old_forward)
    old_logits, old_grads = run()
    assert torch.allclose(new_logits, old_logits, atol=ATOL)
    assert new_grads.keys() == old_grads.keys() and any("attn.k_proj" in n for n in new_grads)
    for n, g in new_grads.items():
        assert torch.allclose(g, old_grads[n], atol=ATOL), n
