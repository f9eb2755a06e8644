"""Targets of other families than Llama decode losslessly: Qwen3 (per-head QK-norm), Gemma 3 (sliding-window layers
mixed with global ones, QK-norm, embeddings scaled by sqrt(d), a tied head) and Mistral (every layer sliding), tiny
and random, beside Llama.

The sliding windows are 4 tokens, so every test below crosses them: a sliding layer must not see keys older than its
window, and rolling back a rejected draft must not lose keys a sliding cache would have dropped.
"""

import pytest
import torch
from infer_helpers import chi2_pvalue, exact_marginals, hf_greedy, make_drafter

from dspark_lightning.infer import decode
from dspark_lightning.infer.acceptance.sampling import SamplingParams
from dspark_lightning.infer.schedule.sps import SPSTable
from dspark_lightning.infer.verify.hf import build_verifier
from dspark_lightning.infer.verify.lean import lean_unsupported
from dspark_lightning.testing import FAMILIES, random_target

SCHEDULERS = ["static", "threshold", "hardware_aware", "async_hardware_aware", "auto"]
PROMPTS = [[5, 17, 33, 2, 90, 7, 8, 41], [9, 200, 3], [100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110]]


@pytest.fixture(scope="module", params=FAMILIES)
def family_target(request):
    return request.param, random_target(family=request.param, layers=4, seed=1)


def test_the_auto_verifier_is_lean_where_it_computes_the_same_function(family_target):
    family, target = family_target
    why = lean_unsupported(target)
    assert (why is None) == (family in ("llama", "qwen3")), why
    if family == "gemma3":
        assert "gemma3_text" in why
    if family == "mistral":
        assert "sliding-window" in why


def test_plain_greedy_decode_is_hf_generate(family_target):
    _, target = family_target
    for verifier in ["auto", "hf"]:
        res = decode(target, None, PROMPTS, max_new_tokens=16, stop_token_ids=[], verifier=verifier)
        for p, got in zip(PROMPTS, res.token_ids, strict=True):
            assert got == hf_greedy(target, p, 16)


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_speculative_greedy_decode_is_hf_generate(family_target, scheduler):
    """Every scheduler, a random drafter (rejections at every position) and a batch of three: the target's output."""
    _, target = family_target
    drafter = make_drafter(target, "dspark", block_size=3)
    res = decode(target, drafter, PROMPTS, max_new_tokens=16, stop_token_ids=[], scheduler=scheduler)
    for p, got in zip(PROMPTS, res.token_ids, strict=True):
        assert got == hf_greedy(target, p, 16)


@pytest.mark.parametrize("family", ["gemma3", "mistral"])
def test_sliding_layers_see_only_their_window(family):
    """A 4-token window really applies: the same target with the window widened to the context decodes otherwise."""
    narrow = random_target(family=family, layers=4, seed=1)
    wide = random_target(family=family, layers=4, seed=1, sliding_window=64)
    p = PROMPTS[2]
    a = decode(narrow, None, [p], max_new_tokens=12, stop_token_ids=[]).token_ids[0]
    b = decode(wide, None, [p], max_new_tokens=12, stop_token_ids=[]).token_ids[0]
    assert a == hf_greedy(narrow, p, 12) and b == hf_greedy(wide, p, 12)
    assert a != b


def test_the_cache_keeps_every_position_of_sliding_layers():
    """Rolling back needs keys a sliding cache drops: the verifier's cache holds full layers, the window is a mask."""
    target = random_target(family="gemma3", layers=4, seed=1)
    layers = target.new_cache().layers
    assert len(layers) == 4 and not any(getattr(layer, "is_sliding", False) for layer in layers)
    assert target.windows == {"sliding_attention": 4, "full_attention": None}


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_lean_or_hf_prefill_is_the_targets_forward(family):
    target = random_target(family=family, layers=4, seed=2)
    ids = list(range(3, 13))
    ref = target(torch.tensor([ids]))
    out = build_verifier("auto", target).prefill([0], [ids])
    assert torch.allclose(out.context, ref.context, rtol=1e-4, atol=1e-4)
    assert torch.allclose(out.hidden, ref.hidden, rtol=1e-4, atol=1e-4)


# --- T > 0: the output law is the target's, exactly --------------------------------------------------------------
N = 3000
PROMPT = [1, 2, 3, 4]


@pytest.fixture(scope="module", params=["qwen3", "gemma3"])
def toy_family(request):
    """An 8-token vocabulary, small enough to enumerate the exact law of the first outputs."""
    return random_target(vocab=8, hidden=32, layers=4, init=0.15, seed=1, family=request.param)


@pytest.mark.parametrize("scheduler", ["static", "hardware_aware"])
def test_output_law_at_temperature_one(toy_family, scheduler):
    """4 prompt tokens + 4 outputs cross the 4-token window; the joint law of positions 1 and 3 is the target's."""
    marg = exact_marginals(toy_family, PROMPT, 4, SamplingParams(1.0))
    drafter = make_drafter(toy_family, "dspark", block_size=3)
    sps = SPSTable.from_points({1: 1.0, N: 1.0, int(1.5 * N): 0.8, 2 * N: 0.55, 4 * N: 0.3})
    spec = (
        {"class_path": "hardware_aware", "init_args": {"sps": sps, "include_draft_time": False}}
        if scheduler != "static"
        else scheduler
    )
    res = decode(toy_family, drafter, [PROMPT] * N, max_new_tokens=4, stop_token_ids=[], temperature=1.0,
                 scheduler=spec, seed=11)  # fmt: skip
    out = torch.tensor(res.token_ids)
    assert out.shape == (N, 4)
    assert res.stats.mean_verify_len > 0  # drafts were verified, not plain decoding
    for pos in (1, 3):
        counts = torch.bincount(out[:, pos], minlength=8).double()
        assert chi2_pvalue(counts, marg[pos]) > 1e-3, (pos, counts, marg[pos])
