"""The embedded SmolLM2 target loads offline from its safetensors cache and matches the GGUF-loaded model."""

import time

import pytest
import torch

pytestmark = pytest.mark.slow


def test_embedded_smollm2_matches_gguf_and_reloads_fast():
    from dspark_lightning.targets import load_target
    from dspark_lightning.targets.embedded import SMOLLM2, embedded_path, load_smollm2_from_gguf

    path = embedded_path(SMOLLM2)  # converts once (~30 s), then reuses the cache
    assert (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()
    from transformers import AutoModelForCausalLM

    t0 = time.perf_counter()
    AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True)
    print(f"plain reload from the safetensors cache: {time.perf_counter() - t0:.2f} s")

    target = load_target(SMOLLM2)
    assert target.geometry.num_layers == 30 and target.geometry.hidden_size == 576
    assert list(target.geometry.layer_ids) == [1, 8, 14, 20, 27]
    gguf_model, gguf_tok = load_smollm2_from_gguf()
    ids = target.encode_prompt([{"role": "user", "content": "What is 17*23?"}])
    assert ids == list(
        gguf_tok.apply_chat_template(
            [{"role": "user", "content": "What is 17*23?"}], add_generation_prompt=True, tokenize=True
        )["input_ids"]
    )
    x = torch.tensor([ids])
    with torch.no_grad():
        ours = target.logits(target(x).hidden)
        ref = gguf_model(x).logits
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-4)
    assert ours[0, -1].argmax() == ref[0, -1].argmax()
