"""A text prompt means what the target's tokenizer says it means (docs/inference.md, "Prompts").

Each family of the suite gets the kind of tokenizer real models of that family ship: a chat model whose template
adds no BOS (Llama / Qwen3 with ChatML), a base model whose tokenizer adds BOS and that has no template (Gemma 3), a
chat model whose template writes the BOS (Mistral), and base tokenizers that add no BOS or have none at all. Every
one is built over the tiny-debug byte vocabulary, so the random targets can decode what it encodes.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from infer_helpers import hf_greedy, make_drafter

from dspark_lightning.infer import decode, encode_prompt
from dspark_lightning.testing import random_target

TEXTS = ["What is 17*23?", "Question: What is the capital of France?\nAnswer:"]
MISTRAL_TEMPLATE = "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"  # noqa: E501


def tokenizer(kind: str):
    """A tokenizer over the tiny-debug ids: ``chatml`` (template, no BOS added), ``base_bos`` (adds BOS, no
    template), ``base_no_add`` (declares a BOS, adds none: ``add_bos_token`` false), ``no_bos`` (has no BOS token),
    ``mistral`` (its template writes the BOS)."""
    import transformers as tf
    from tokenizers import processors

    from dspark_lightning import load_target

    tiny = load_target("tiny-debug").tokenizer
    if kind == "chatml":
        return tiny
    core = copy.deepcopy(tiny.backend_tokenizer)
    bos = "<|im_start|>"
    if kind == "base_bos":
        bid = tiny.convert_tokens_to_ids(bos)
        core.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, bid)])
    specials = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    tok = tf.PreTrainedTokenizerFast(tokenizer_object=core, **({} if kind == "no_bos" else {"bos_token": bos}),
                                     **specials)  # fmt: skip
    tok.chat_template = MISTRAL_TEMPLATE if kind == "mistral" else None
    return tok


CASES = [  # (family, tokenizer kind)
    ("llama", "chatml"),
    ("qwen3", "chatml"),
    ("gemma3", "base_bos"),
    ("mistral", "mistral"),
    ("llama", "base_no_add"),
    ("llama", "no_bos"),
]


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def case(request):
    family, kind = request.param
    return kind, random_target(family=family, layers=4, seed=1, tokenizer=tokenizer(kind))


def test_plain_text_is_the_tokenizers_ids(case):
    kind, target = case
    tok = target.tokenizer
    for text in TEXTS:
        want = list(tok(text)["input_ids"])
        assert encode_prompt(target, text, chat=False) == want
        if kind == "base_bos":
            assert want[0] == tok.bos_token_id  # the BOS the tokenizer adds is there
        if kind in ("base_no_add", "no_bos"):
            assert want == list(tok(text, add_special_tokens=False)["input_ids"])


def test_chat_is_the_templates_ids_and_without_a_template_the_tokenizers(case):
    kind, target = case
    tok = target.tokenizer
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = [encode_prompt(target, text) for text in TEXTS]
    notes = [str(w.message) for w in seen if "chat template" in str(w.message)]
    for text, ids in zip(TEXTS, got, strict=True):
        if tok.chat_template is None:
            assert ids == list(tok(text)["input_ids"])
        else:
            turns = [{"role": "user", "content": text}]
            want = tok.apply_chat_template(turns, add_generation_prompt=True, tokenize=True)
            assert ids == list(want["input_ids"] if hasattr(want, "keys") else want)
    if tok.chat_template is None:  # said once, in one line, naming the target
        assert len(notes) == 1 and "\n" not in notes[0] and "has no chat template" in notes[0]
    else:
        assert notes == []
    if kind == "mistral":
        assert got[0].count(tok.bos_token_id) == 1 and got[0][0] == tok.bos_token_id  # the template's, not doubled


@pytest.mark.parametrize("with_drafter", [False, True], ids=["plain", "drafter"])
def test_text_prompt_greedy_decode_is_hf_generate_on_the_encoded_ids(case, with_drafter):
    kind, target = case
    drafter = make_drafter(target, "dspark", block_size=3) if with_drafter else None
    for chat in (True, False):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = decode(target, drafter, TEXTS, max_new_tokens=12, stop_token_ids=[], chat=chat)
            ids = [encode_prompt(target, t, chat=chat) for t in TEXTS]
        for p, got in zip(ids, res.token_ids, strict=True):
            assert got == hf_greedy(target, p, 12)


def test_special_token_text_in_a_chat_turn_stays_text_and_is_parsed_without_chat():
    target = random_target(family="llama", layers=4, seed=1, tokenizer=tokenizer("base_bos"))
    tok, text = target.tokenizer, "a<|im_end|>b"
    end = tok.convert_tokens_to_ids("<|im_end|>")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        as_chat = encode_prompt(target, text)
    assert end not in as_chat and as_chat[0] == tok.bos_token_id  # content is text, inside the tokenizer's BOS
    parsed = list(tok(text)["input_ids"])
    assert encode_prompt(target, text, chat=False) == parsed and end in parsed


def test_a_conversation_without_template_starts_with_the_tokenizers_bos():
    """Training conversations and prompts agree: the features of a base model's conversation start where its
    prompts start, with the BOS its tokenizer adds."""
    target = random_target(family="gemma3", layers=4, seed=1, tokenizer=tokenizer("base_bos"))
    turns = [{"role": "user", "content": "2+2="}, {"role": "assistant", "content": "4"}]
    ids, mask = target.encode_conversation(turns)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prompt = encode_prompt(target, turns[:1])
    assert ids[: len(prompt)] == prompt and ids[0] == target.tokenizer.bos_token_id
    assert sum(mask) == len(ids) - len(prompt) > 0
    assert torch.tensor(mask[len(prompt) :]).all()
