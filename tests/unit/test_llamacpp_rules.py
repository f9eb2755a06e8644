"""``export --server llamacpp`` refuses, in one line and before converting, what llama.cpp b11434 would reject or run
wrongly (read from its converter ``conversion/qwen.py`` and graph ``src/models/dflash.cpp``); ``all`` adds the GGUF
only where llama.cpp's rules pass."""

import json

import pytest
import torch

from dspark_lightning import create
from dspark_lightning.export import InteropError, export_serving
from dspark_lightning.export.llamacpp import check_target


def drafter(target, head="vanilla"):
    torch.manual_seed(0)
    if head is None:
        return create(
            "drafter", "dflash", target, block_size=3, backbone={"class_path": "dense", "init_args": {"num_layers": 1}}
        )
    return create(
        "drafter",
        "dspark",
        target,
        block_size=3,
        backbone={"class_path": "dense", "init_args": {"num_layers": 1}},
        seq_head={"class_path": head, "init_args": {"rank": 8}},
    )


@pytest.mark.parametrize(
    "head,match",
    [
        ("gated", "llamacpp: markov_head_type 'gated' is refused"),
        ("rnn", "llamacpp: markov_head_type 'rnn'"),
        (None, "llamacpp: markov_rank 0 \\(a DFlash drafter\\) is refused"),
    ],  # fmt: skip
)
def test_heads_llamacpp_cannot_run_are_refused_before_any_file(tiny_target, tmp_path, head, match):
    with pytest.raises(InteropError, match=match) as e:
        export_serving(drafter(tiny_target, head), tiny_target, "dspark-hf", tmp_path / "out", server="llamacpp")
    assert "\n" not in str(e.value) and not (tmp_path / "out").exists()


def test_moe_and_context_state_are_refused_for_llamacpp(tiny_target, tmp_path):
    d = create("drafter", "dspark", tiny_target, block_size=3, backbone={"class_path": "dense",
               "init_args": {"num_layers": 1, "context_state": True}})  # fmt: skip
    with pytest.raises(InteropError, match="context_state=true"):
        export_serving(d, tiny_target, "dspark-hf", tmp_path / "out", server="llamacpp")
    moe = create(
        "drafter",
        "dspark",
        tiny_target,
        block_size=3,
        backbone={"class_path": "moe_swa", "init_args": {"num_layers": 1}},
    )
    with pytest.raises(InteropError, match="moe_swa backbone"):
        export_serving(moe, tiny_target, "dspark-hf", tmp_path / "out", server="llamacpp")


def test_eagle3_is_not_converted_for_llamacpp(tmp_path):
    from dspark_lightning import load_target

    three = load_target("tiny-debug", layer_ids=[1, 3, 5])  # an EAGLE-3 the HF-layout servers load
    e3 = create("drafter", "eagle3", three, block_size=3)
    export_serving(e3, three, "eagle3-hf", tmp_path / "vllm", server="vllm")
    refusal = "server {} does not serve layout eagle3-hf (it serves: dspark-hf)"
    with pytest.raises(InteropError) as e:
        export_serving(e3, three, "eagle3-hf", tmp_path / "out", server="llamacpp")
    assert str(e.value) == refusal.format("llamacpp") and not (tmp_path / "out").exists()
    res = export_serving(e3, three, "eagle3-hf", tmp_path / "all", server="all")  # the folder vLLM and SGLang load
    left_out = {n for n in res.notes if "does not serve" in n}
    assert left_out == {
        f"no {s} files in this all-servers folder: {refusal.format(s)}" for s in ["deepspec", "llamacpp"]
    }


@pytest.mark.parametrize("arch,ok", [("LlamaForCausalLM", True), ("Qwen3ForCausalLM", True),
                                     ("Qwen2ForCausalLM", False), ("Gemma3ForCausalLM", False)])  # fmt: skip
def test_targets_whose_llamacpp_graph_hides_layer_inputs_are_refused(tmp_path, arch, ok):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": [arch]}))
    if ok:
        check_target(tmp_path)
    else:
        with pytest.raises(InteropError, match=f"target architecture '{arch}'"):
            check_target(tmp_path)


def test_all_leaves_the_gguf_out_with_a_note_where_llamacpp_cannot_take_it(tiny_target, tmp_path):
    """tiny-debug's byte-level tokenizer is not one llama.cpp's converter knows: the HF-layout servers still get
    their folder, and the note says why there is no draft.gguf."""
    res = export_serving(drafter(tiny_target), tiny_target, "dspark-hf", tmp_path / "all", server="all")
    assert (res.path / "config.json").is_file() and not (res.path / "draft.gguf").exists()
    assert any(n.startswith("no draft.gguf in this all-servers folder: llamacpp:") for n in res.notes), res.notes
    with pytest.raises(InteropError, match="llamacpp: llama.cpp's converter .* refused the drafter: .*pre-tokenizer"):
        export_serving(drafter(tiny_target), tiny_target, "dspark-hf", tmp_path / "l", server="llamacpp")
    assert not (tmp_path / "l").exists()
