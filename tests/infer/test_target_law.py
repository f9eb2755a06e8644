"""docs/algorithm.md §1 (ii): the target's law is its own forward's, logit post-processing included.

Granite divides its LM head's logits by ``logits_scaling``, Cohere multiplies them by ``logit_scale``, Gemma-2
soft-caps them. Tiny random models of each (vocabulary 8, so exact laws can be enumerated) check that
``Target.logits`` and both verifiers give the model's own law, that ``decode()`` is greedy-equal to HF
``generate()`` and samples that law (χ²), and that a head dspark-lightning cannot reproduce is refused at load.
"""

import pytest
import torch
from infer_helpers import chi2_pvalue, exact_marginals, hf_greedy, make_drafter
from transformers import (
    CohereConfig,
    CohereForCausalLM,
    Gemma2Config,
    Gemma2ForCausalLM,
    GraniteConfig,
    GraniteForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
)

from dspark_lightning import load_target
from dspark_lightning.infer import SamplingParams, build_verifier, decode, probs
from dspark_lightning.infer.verify.lean import lean_unsupported

V, LAYERS = 8, 4
N_SAMPLES = 4000
PROMPT = [1, 2, 3, 4]


class SoftcapLlama(LlamaForCausalLM):
    """A Llama whose forward soft-caps its logits (as NanoChat's does): the lean verifier runs it."""

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        cap = self.config.final_logit_softcapping
        out.logits = torch.tanh(out.logits / cap) * cap
        return out


class DoubledLlama(LlamaForCausalLM):
    """A Llama whose forward scales its logits by a constant found in no config field: not reproducible."""

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        out.logits = out.logits * 2
        return out


# Constants far from the identity, so that skipping the step moves the law well beyond the χ² test's noise.
ARCHS = {
    "granite": (GraniteConfig, GraniteForCausalLM, {"logits_scaling": 0.25}),  # divides: 4x sharper
    "cohere": (CohereConfig, CohereForCausalLM, {"logit_scale": 3.0}),
    "gemma2": (
        Gemma2Config,
        Gemma2ForCausalLM,
        {"final_logit_softcapping": 0.5, "layer_types": ["full_attention"] * LAYERS, "head_dim": 8},
    ),
    "llama_softcap": (LlamaConfig, SoftcapLlama, {"final_logit_softcapping": 0.5}),
}


def tiny_model(config_cls, model_cls, seed: int = 1, **fields):
    cfg = config_cls(
        vocab_size=V,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=0.15,
        tie_word_embeddings=False,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=0,
        **fields,
    )
    torch.manual_seed(seed)
    return model_cls(cfg).eval()


@pytest.fixture(scope="module", params=list(ARCHS))
def arch_target(request, tiny_target):
    config_cls, model_cls, fields = ARCHS[request.param]
    model = tiny_model(config_cls, model_cls, **fields)
    return load_target(model, layer_ids=[0, 1, 2], tokenizer=tiny_target.tokenizer)


def raw_law(target, seqs: list[list[int]]) -> torch.Tensor:
    """The law of the LM head alone (no post-processing): what the target's law was before this fix."""
    with torch.no_grad():
        h = target(torch.tensor(seqs)).hidden[:, -1]
        return target.lm_head(h).float().softmax(-1)


def test_target_logits_give_the_forward_law(arch_target):
    seqs = torch.tensor([PROMPT, [5, 6, 7, 0], [3, 3, 1, 2]])
    with torch.no_grad():
        want = arch_target.model(input_ids=seqs).logits.float().softmax(-1)
        got = probs(arch_target.logits(arch_target(seqs).hidden), SamplingParams(1.0))
    torch.testing.assert_close(got, want)
    assert (got - raw_law(arch_target, seqs.tolist())[:, None]).abs().sum(-1)[:, -1].max() > 0.1  # the step matters


def test_every_verifier_gives_the_forward_law(arch_target):
    names = ["hf"] + (["lean"] if lean_unsupported(arch_target) is None else [])
    with torch.no_grad():
        want = arch_target.model(input_ids=torch.tensor([PROMPT])).logits.float().softmax(-1)
        for name in names:
            v = build_verifier(name, arch_target)
            out = v.prefill([0], [PROMPT])
            torch.testing.assert_close(probs(v.logits(out.hidden), SamplingParams(1.0)), want, msg=name)


def test_greedy_equals_hf_generate(arch_target):
    drafter = make_drafter(arch_target, block_size=3)
    prompts = [PROMPT, [7, 1], [2, 5, 5, 6, 3, 1]]  # no 0: HF generate() masks its pad id
    want = [hf_greedy(arch_target, p, 16) for p in prompts]
    res = decode(arch_target, drafter, prompts, max_new_tokens=16, stop_token_ids=[])
    assert res.token_ids == want


def test_decode_samples_the_forward_law(arch_target):
    """χ² through decode() with a random drafter against the exact law of the model's own forward; the LM-head-only
    law (no scale / soft cap) is rejected by the same samples, so the test can see the difference."""
    params = SamplingParams(1.0)
    exact = exact_marginals(arch_target, PROMPT, 2, params)
    drafter = make_drafter(arch_target, block_size=3)
    res = decode(
        arch_target,
        drafter,
        [PROMPT] * N_SAMPLES,
        max_new_tokens=2,
        stop_token_ids=[],
        temperature=1.0,
        seed=3,
        scheduler="static",  # every draft verified: the acceptance test decides every token
    )
    out = torch.tensor(res.token_ids)
    assert res.stats.mean_verify_len > 0  # the drafter's tokens really went through the acceptance test
    for pos in (0, 1):
        counts = torch.bincount(out[:, pos], minlength=V).double()
        assert chi2_pvalue(counts, exact[pos]) > 1e-3, (pos, counts, exact[pos])
    first = torch.bincount(out[:, 0], minlength=V).double()
    assert chi2_pvalue(first, raw_law(arch_target, [PROMPT])[0].double()) < 1e-3


def test_an_unreproducible_head_is_refused(tiny_target):
    model = tiny_model(LlamaConfig, DoubledLlama)
    with pytest.raises(ValueError, match=r"cannot reproduce") as err:
        load_target(model, layer_ids=[0, 1, 2], tokenizer=tiny_target.tokenizer)
    assert "\n" not in str(err.value)


def test_a_known_step_its_forward_ignores_is_refused(tiny_target):
    """The probe also checks the table: a Llama config carrying a Cohere-style ``logit_scale`` that its forward never
    applies would otherwise be scaled by Target.logits alone."""
    model = tiny_model(LlamaConfig, LlamaForCausalLM, logit_scale=3.0)
    with pytest.raises(ValueError, match=r"cannot reproduce"):
        load_target(model, layer_ids=[0, 1, 2], tokenizer=tiny_target.tokenizer)
