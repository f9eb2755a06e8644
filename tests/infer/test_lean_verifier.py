"""The lean target forward computes what the HF forward computes, through ragged rounds, rollbacks and removals."""

import pytest
import torch

from dspark_lightning.infer import HFVerifier, LeanVerifier, build_verifier
from dspark_lightning.infer.verify.lean import lean_unsupported


def close(a, b, what):
    """Equal up to fp32 reassociation: max error <= 1e-5 of the tensor's largest magnitude."""
    err, scale = float((a - b).abs().max()), max(1.0, float(b.abs().max()))
    assert err <= 1e-5 * scale, (what, err, scale)


@pytest.mark.parametrize("kernels", ["linear", "auto"])
def test_lean_matches_hf_through_rounds_rollbacks_and_removals(varied_target, kernels):
    V = varied_target.geometry.vocab_size
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, V, (n,), generator=g).tolist() for n in (5, 9, 5, 7)]
    hf, lean = HFVerifier(varied_target), LeanVerifier(varied_target, capacity=8, kernels=kernels)  # capacity 8: grows
    ids = [10, 11, 12, 13]
    a, b = hf.prefill(ids, prompts), lean.prefill(ids, prompts)
    close(b.hidden, a.hidden, "prefill hidden")
    close(b.context, a.context, "prefill features")
    pos = {rid: len(p) for rid, p in zip(ids, prompts, strict=True)}
    for step in range(8):
        live = list(pos)
        order = live if step % 2 == 0 else live[::-1]  # any request order
        n = torch.randint(1, 6, (len(order),), generator=g)  # ragged: 1..5 tokens per request (M = 4..20 rows)
        toks = torch.randint(0, V, (len(order), int(n.max())), generator=g)
        start = torch.tensor([pos[r] for r in order])
        a, b = hf.forward(order, toks, n, start), lean.forward(order, toks, n, start)
        valid = torch.arange(toks.shape[1])[None] < n[:, None]
        close(b.hidden[valid], a.hidden[valid], f"step {step} hidden")
        close(b.context[valid], a.context[valid], f"step {step} features")
        close(lean.logits(b.hidden[valid]), hf.logits(a.hidden[valid]), f"step {step} logits")
        keep = torch.minimum(torch.randint(0, 5, (len(order),), generator=g), n - 1)  # accepted drafts
        rid_t = torch.tensor(order)
        hf.commit(rid_t, start + keep)
        lean.commit(rid_t, start + keep)
        for r, k in zip(order, keep.tolist(), strict=True):
            pos[r] += k + 1
            assert lean.cached_length(r) == hf.cached_length(r) == pos[r]
        if step == 3:  # a request in the middle finishes: the last row moves into its place
            hf.remove([11])
            lean.remove([11])
            del pos[11]
            assert lean.cached_length(11) == 0
        if step == 5:  # a new request joins
            p = torch.randint(0, V, (6,), generator=g).tolist()
            close(lean.prefill([14], [p]).hidden, hf.prefill([14], [p]).hidden, "late prefill")
            pos[14] = 6


def test_auto_picks_lean_where_supported(varied_target):
    assert isinstance(build_verifier("auto", varied_target), LeanVerifier)
    assert isinstance(build_verifier("auto", varied_target, batching="flat"), HFVerifier)
    assert "padded only" in lean_unsupported(varied_target, "flat")
    with pytest.raises(NotImplementedError, match="verifier='hf'"):
        LeanVerifier(varied_target, batching="flat")


@pytest.mark.parametrize("causal", [False, True])
def test_cpu_low_precision_attention_runs_in_fp32_and_keeps_the_dtype(causal):
    """On a CPU, bf16/fp16 attention is computed in fp32 (PyTorch's CPU flash kernel is several times slower in bf16)
    and cast back: the result is the fp32 attention of the same bf16 inputs, rounded once, in the inputs' dtype."""
    import torch.nn.functional as F

    from dspark_lightning.infer.verify.lean import attention

    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(3, 6, s, 16, generator=g) for s in (4, 9, 9))
    k, v = k[:, :2], v[:, :2]  # GQA: 6 query heads over 2 key/value heads
    mask = None if causal else torch.zeros(3, 1, 4, 9).masked_fill(torch.rand(3, 1, 4, 9, generator=g) < 0.3, -1e9)
    for dt in (torch.bfloat16, torch.float16):
        args = (q.to(dt), k.to(dt), v.to(dt), None if mask is None else mask.to(dt), causal, 0.25, True)
        out = attention(*args, fp32=True)
        m32 = None if mask is None else mask.to(dt).float()
        ref = F.scaled_dot_product_attention(q.to(dt).float(), k.to(dt).float(), v.to(dt).float(), attn_mask=m32,
                                             is_causal=causal, scale=0.25, enable_gqa=True).to(dt)  # fmt: skip
        assert out.dtype == dt and torch.equal(out, ref)
        native = F.scaled_dot_product_attention(*args[:3], attn_mask=args[3], is_causal=causal, scale=0.25,
                                                enable_gqa=True)  # fmt: skip
        assert torch.equal(attention(*args), native)  # off (decoding): PyTorch's own kernel in the inputs' dtype
    out32 = attention(q, k, v, mask, causal, 0.25, True, fp32=True)  # fp32 is passed through as it is
    assert torch.equal(out32, F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=0.25,
                                                             enable_gqa=True))  # fmt: skip
