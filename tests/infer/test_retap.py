"""Taps are which hidden states a target returns, not weights: a target loaded with other taps than its drafter reads
is re-tapped to the drafter's (``Target.tap``) wherever the two meet (``load_drafter(path, target)``, ``decode()``
with a drafter object or a path, ``checkpoint.load_target_and_drafters``), and decodes as one loaded with those taps.
"""

import pytest
import torch
from infer_helpers import hf_greedy, make_drafter
from transformers import LlamaConfig, LlamaForCausalLM

from dspark_lightning import load_drafter, load_target
from dspark_lightning.checkpoint import load_target_and_drafters, save_drafter
from dspark_lightning.checks import UsageError
from dspark_lightning.infer import decode
from dspark_lightning.infer.verify.hf import build_verifier

LAYERS = 6
DEFAULT = (1, 2, 3)  # default_layer_ids(6)
TAPS = [1, 3, 4]  # what the drafters below were trained on
PROMPTS = ([5, 17, 33, 2, 90], [40, 41, 42])
N = 12


def target(layer_ids=None):
    """A tiny random Llama, the same weights on every call (its own model: re-tapping it touches no other test)."""
    cfg = LlamaConfig(vocab_size=260, hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
                      num_attention_heads=4, num_key_value_heads=2, initializer_range=0.3, tie_word_embeddings=False,
                      max_position_embeddings=512, eos_token_id=None, bos_token_id=None, pad_token_id=0)  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    return load_target(model, layer_ids=layer_ids, tokenizer=load_target("tiny-debug").tokenizer)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A random drafter trained (so to speak) on TAPS, exported."""
    t = target(TAPS)
    return save_drafter(make_drafter(t, block_size=3), tmp_path_factory.mktemp("retap") / "drafter", t)


def run(t, drafter, verifier="auto"):
    return decode(t, drafter, list(PROMPTS), max_new_tokens=N, scheduler="static", stop_token_ids=[],
                  verifier=verifier, drafter_dtype=None)  # fmt: skip


def rounds(res):
    """What the drafter's features decide, round by round: draft margins, confidences, accepted counts."""
    log = res.log
    assert log.margins and log.conf_logits, "the drafter ran no round"
    return torch.stack(log.margins), torch.stack(log.conf_logits), list(log.accepted)


def test_tap_replaces_the_hooks_and_the_tapped_layers():
    t, ref = target(), target(TAPS)
    assert t.geometry.layer_ids == DEFAULT
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    assert t.tap(TAPS) is t and t.geometry.layer_ids == tuple(TAPS)
    assert [len(layer._forward_hooks) for layer in t.decoder_layers] == [0, 1, 0, 1, 1, 0]  # the old hooks are gone
    assert torch.equal(t(ids).context, ref(ids).context)
    lean = build_verifier("lean", t).prefill([0], [ids[0].tolist()]).context  # built after the re-tap: its taps
    assert torch.allclose(lean, ref(ids).context, rtol=1e-4, atol=1e-4)
    for bad in ([1, LAYERS - 1], [], [1.0, 2]):  # the last layer, none, not integers: refused, nothing changed
        with pytest.raises(ValueError, match="layer"):
            t.tap(bad)
        assert t.geometry.layer_ids == tuple(TAPS)
        assert torch.equal(t(ids).context, ref(ids).context)


def test_load_drafter_retaps_the_target_and_decodes_as_the_right_taps_do(exported):
    ref = target(TAPS)
    want = run(ref, load_drafter(exported, ref))
    t = target()
    drafter = load_drafter(exported, t)
    assert t.geometry.layer_ids == tuple(TAPS) == drafter.geometry.layer_ids
    plain = run(t, None)
    for verifier in ("hf", "lean"):
        got = run(t, drafter, verifier)
        assert got.token_ids == plain.token_ids == [hf_greedy(t, p, N) for p in PROMPTS]
        for a, b in zip(rounds(got), rounds(want), strict=True):  # the drafter read the features it was trained on
            assert a == b if isinstance(a, list) else torch.allclose(a, b, atol=1e-4)


@pytest.mark.parametrize("given", ["object", "path"])
def test_decode_retaps_the_target_to_the_drafter(exported, given):
    ref = target(TAPS)
    want = rounds(run(ref, load_drafter(exported, ref)))
    t = target()
    drafter = load_drafter(exported, target()) if given == "object" else exported  # an object placed on another copy
    got = run(t, drafter)
    assert t.geometry.layer_ids == tuple(TAPS)
    assert got.token_ids == run(target(), None).token_ids
    for a, b in zip(rounds(got), want, strict=True):
        assert a == b if isinstance(a, list) else torch.allclose(a, b, atol=1e-4)
    wrong = make_drafter(target(), block_size=3)  # a drafter of the default taps: the same target follows it back
    run(t, wrong)
    assert t.geometry.layer_ids == DEFAULT


def test_drafters_of_different_taps_together_are_refused_in_one_line(exported, tmp_path):
    t = target()
    other = save_drafter(make_drafter(t, block_size=3), tmp_path / "default_taps", t)
    with pytest.raises(UsageError, match=r"read different target layers \(\[1, 3, 4\] and \[1, 2, 3\]\)") as exc:
        load_target_and_drafters(t, [exported, other])
    assert "\n" not in str(exc.value)
    assert t.geometry.layer_ids == DEFAULT  # refused before anything was loaded or re-tapped
    same = save_drafter(make_drafter(target(TAPS), block_size=3, seed=1), tmp_path / "taps", target(TAPS))
    _, loaded = load_target_and_drafters(t, [exported, same], drafter_dtype=None)
    assert t.geometry.layer_ids == tuple(TAPS) and len(loaded) == 2


def test_the_documented_composition_load_drafter_path_and_load_target_name(tmp_path):
    """README's five lines on the embedded tiny target: ``load_drafter(path)`` loads the target it records with the
    taps it was trained on, ``load_target(name)`` the default taps; ``decode()`` runs them together. A memoised target
    asked for again gets the taps the call asks for."""
    default = load_target("tiny-debug").geometry.layer_ids
    taps = [i + 1 for i in default]
    path = save_drafter(make_drafter(load_target("tiny-debug", layer_ids=taps), block_size=3), tmp_path / "d",
                        load_target("tiny-debug", layer_ids=taps))  # fmt: skip
    t = load_target("tiny-debug")
    try:
        drafter = load_drafter(path)
        assert drafter.geometry.layer_ids == tuple(taps)
        res = decode(t, drafter, ["What is 17*23?"], max_new_tokens=8, temperature=0.0, scheduler="static")
        assert t.geometry.layer_ids == tuple(taps)
        assert res.token_ids == decode(t, None, ["What is 17*23?"], max_new_tokens=8, scheduler="static").token_ids
    finally:
        assert load_target("tiny-debug") is t and t.geometry.layer_ids == default  # tapped back for the next test
