"""Shallow targets are a real user's case: a 4-layer Llama with the default taps, and taps that repeat a layer."""

import pytest
import torch
from infer_helpers import hf_greedy, make_drafter
from transformers import LlamaConfig, LlamaForCausalLM

from dspark_lightning import load_target
from dspark_lightning.infer import decode
from dspark_lightning.infer.verify.hf import build_verifier


def shallow(layers: int, layer_ids=None):
    cfg = LlamaConfig(vocab_size=260, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, initializer_range=0.3, tie_word_embeddings=False,
                      max_position_embeddings=512, eos_token_id=None, bos_token_id=None, pad_token_id=0)  # fmt: skip
    torch.manual_seed(layers)
    model = LlamaForCausalLM(cfg).eval()
    return load_target(model, layer_ids=layer_ids, tokenizer=load_target("tiny-debug").tokenizer)


@pytest.mark.parametrize(("layers", "layer_ids"), [(4, None), (6, None), (4, [1, 1, 0]), (5, [2, 0, 2])])
def test_decode_on_a_shallow_target_is_its_greedy_output(layers, layer_ids):
    target = shallow(layers, layer_ids)
    prompt = [5, 17, 33, 2, 90]
    want = hf_greedy(target, prompt, 12, [])
    assert decode(target, None, [prompt], max_new_tokens=12, stop_token_ids=[]).token_ids[0] == want
    drafter = make_drafter(target, "dspark", block_size=3)
    assert decode(target, drafter, [prompt], max_new_tokens=12, stop_token_ids=[]).token_ids[0] == want


@pytest.mark.parametrize("layer_ids", [None, [1, 1, 0]])
def test_lean_prefill_features_are_the_targets_tapped_outputs(layer_ids):
    """The lean verifier's context equals the target's own forward, slot by slot, also when a layer is tapped twice."""
    target = shallow(4, layer_ids)
    ids = [7, 8, 9, 10, 11, 12]
    ref = target(torch.tensor([ids]))
    out = build_verifier("lean", target).prefill([0], [ids])
    assert out.context.shape == ref.context.shape
    assert torch.allclose(out.context, ref.context, rtol=1e-4, atol=1e-4)
    assert torch.allclose(out.hidden, ref.hidden, rtol=1e-4, atol=1e-4)
