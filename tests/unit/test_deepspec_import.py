"""``load_drafter`` reads checkpoints as DeepSpec writes them, single-file or sharded, and decodes the target's output.

The fixture follows DeepSpec's own code (``deepseek-ai/DeepSpec``), not our writer:

- config: ``deepspec/modeling/dspark/qwen3/config.py`` @ 041b6523 (``build_draft_config``): a deep copy of the
  *target's* config with ``architectures``, ``num_target_layers``, ``num_hidden_layers``, ``block_size``,
  ``tie_word_embeddings``, ``layer_types``, ``mask_token_id``, ``target_layer_ids``, ``num_anchors``,
  ``enable_confidence_head``, ``markov_rank`` set, ``confidence_head_with_markov`` only with a confidence head and
  ``markov_head_type`` only with ``markov_rank > 0``; written by transformers' ``save_pretrained`` (DeepSpec pins
  transformers 5.10, whose configs carry ``rope_parameters``, no ``rope_theta``).
- tensors: the module tree of ``Qwen3DSparkModel`` in ``deepspec/modeling/dspark/qwen3/modeling.py`` @ 5905deb7,
  with ``embed_tokens`` / ``lm_head`` copied from the target (``deepspec/trainer/base_trainer.py``
  ``initialize_embeddings_and_head``) and the confidence head of ``deepspec/modeling/dspark/common.py`` @ 3bc8dc74
  (``AcceptRatePredictor``: ``proj``, with bias). ``markov_head.py`` and ``trainer/ckpt_manager.py`` are not in
  the index: the Markov names are those of the published DSpark layout (docs/serving.md), and the files are HF
  ``save_pretrained``'s (``model.safetensors``, or shards and ``model.safetensors.index.json``).
- ``target_layer_ids`` -1 is the embedding output (``extract_context_feature`` in common.py @ 3bc8dc74).
"""

import copy
import json

import pytest
import torch
from safetensors.torch import save_file

from dspark_lightning.checkpoint import DrafterLoadError, load_drafter
from dspark_lightning.testing import assert_decodes_target_greedy

RANK = 8
MARKOV = {
    "vanilla": {},
    "gated": {"gate_proj.weight": lambda d, r: (r, d + r), "gate_proj.bias": lambda d, r: (r,)},
    "rnn": {"joint_proj.weight": lambda d, r: (3 * r, 2 * r + d), "joint_proj.bias": lambda d, r: (3 * r,)},
}


def deepspec_config(target, *, layers, block, mask, head, conf):
    """``build_draft_config`` applied to the target's config object."""
    cfg = copy.deepcopy(target.model.config)
    cfg.architectures = ["Qwen3DSparkModel"]
    cfg.num_target_layers = cfg.num_hidden_layers
    cfg.num_hidden_layers = layers
    cfg.block_size = block
    cfg.tie_word_embeddings = False
    cfg.layer_types = ["full_attention"] * layers
    cfg.mask_token_id = mask
    cfg.target_layer_ids = list(target.geometry.layer_ids)
    cfg.num_anchors = 512
    cfg.enable_confidence_head = conf
    if conf:
        cfg.confidence_head_with_markov = head is not None
    cfg.markov_rank = RANK if head else 0
    if head:
        cfg.markov_head_type = head
    cfg.dtype = torch.bfloat16
    return cfg


def deepspec_tensors(target, cfg, seed=0):
    """Every parameter of DeepSpec's ``Qwen3DSparkModel`` under its name, bf16, random but for embed / head."""
    g = torch.Generator().manual_seed(seed)
    d, H, Hkv, Dh = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    inter = cfg.intermediate_size
    shapes = {"fc.weight": (d, len(cfg.target_layer_ids) * d), "hidden_norm.weight": (d,), "norm.weight": (d,)}
    for i in range(cfg.num_hidden_layers):
        p = f"layers.{i}."
        shapes |= {p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,)}
        shapes |= {p + f"self_attn.{n}_proj.weight": (w * Dh, d) for n, w in (("q", H), ("k", Hkv), ("v", Hkv))}
        shapes |= {p + "self_attn.o_proj.weight": (d, H * Dh), p + "self_attn.q_norm.weight": (Dh,)}
        shapes |= {p + "self_attn.k_norm.weight": (Dh,), p + "mlp.down_proj.weight": (d, inter)}
        shapes |= {p + "mlp.gate_proj.weight": (inter, d), p + "mlp.up_proj.weight": (inter, d)}
    r, V = cfg.markov_rank, cfg.vocab_size
    if r:
        shapes |= {"markov_head.markov_w1.weight": (V, r), "markov_head.markov_w2.weight": (V, r)}
        shapes |= {f"markov_head.{k}": f(d, r) for k, f in MARKOV[cfg.markov_head_type].items()}
    if cfg.enable_confidence_head:
        shapes |= {"confidence_head.proj.weight": (1, d + r), "confidence_head.proj.bias": (1,)}
    state = {k: 0.1 * torch.randn(s, generator=g) + (k.endswith("norm.weight")) for k, s in shapes.items()}
    state["embed_tokens.weight"] = target.embed_tokens.weight.detach().clone()
    state["lm_head.weight"] = target.lm_head.weight.detach().clone()
    return {k: v.to(torch.bfloat16) for k, v in state.items()}


def write_deepspec(path, state, cfg, shards=1):
    """``save_pretrained``'s files: config.json, and model.safetensors or N shards plus their index."""
    cfg.save_pretrained(path)
    if shards == 1:
        save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
        return
    names, weight_map = sorted(state), {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: state[k] for k in names[s::shards]}
        save_file(part, str(path / file), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(part, file)
    total = sum(t.numel() * t.element_size() for t in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


OURS = {  # DeepSpec name prefix -> ours (the map is the servers' published layout, docs/serving.md)
    "fc.": "backbone.fc.",
    "hidden_norm.": "backbone.fuse_norm.",
    "norm.": "backbone.norm.",
    "markov_head.markov_w1.": "seq_head.lr.w1.",
    "markov_head.markov_w2.": "seq_head.lr.w2.",
    "markov_head.gate_proj.": "seq_head.gate.",
    "markov_head.joint_proj.": "seq_head.cell.",
    "confidence_head.proj.": "conf_head.proj.",
}
LAYER = {"input_layernorm.": "input_norm.", "post_attention_layernorm.": "post_norm.", "self_attn.": "attn."}


def ours(name):
    if name.startswith("layers."):
        i, rest = name[len("layers.") :].split(".", 1)
        for a, b in LAYER.items():
            rest = b + rest[len(a) :] if rest.startswith(a) else rest
        return f"backbone.layers.{i}.{rest}"
    return next(b + name[len(a) :] for a, b in OURS.items() if name.startswith(a))


def checkpoint(tmp_path, target, head="vanilla", conf=True, shards=1, layers=2, seed=0):
    cfg = deepspec_config(target, layers=layers, block=4, mask=1, head=head, conf=conf)
    state = deepspec_tensors(target, cfg, seed)
    out = tmp_path / f"ds-{head}-{shards}"
    out.mkdir()
    write_deepspec(out, state, cfg, shards)
    return out, state


def assert_same_weights(drafter, state):
    mine = drafter.state_dict()
    for name, t in state.items():
        if name not in ("embed_tokens.weight", "lm_head.weight"):
            assert torch.equal(mine[ours(name)], t.float()), name


def test_fixture_is_what_deepspec_writes(varied_target, tmp_path):
    out, state = checkpoint(tmp_path, varied_target)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["rope_parameters"]["rope_theta"] == varied_target.geometry.rope_theta and "rope_theta" not in cfg
    assert "draft_vocab_size" not in cfg and "sample_from_anchor" not in cfg and cfg["model_type"] == "llama"
    assert {"embed_tokens.weight", "lm_head.weight"} <= set(state) and cfg["dtype"] == "bfloat16"


def test_deepspec_checkpoint_loads_exactly_and_decodes_the_targets_greedy_output(varied_target, tmp_path):
    target = varied_target
    out, state = checkpoint(tmp_path, target, "vanilla", layers=1)
    drafter = load_drafter(out, target, dtype=torch.float32)
    assert_same_weights(drafter, state)
    assert drafter.block_size == 4 and drafter.mask_token_id == 1 and drafter.conf_head is not None
    assert_decodes_target_greedy(target, drafter)


@pytest.mark.parametrize("head", ["gated", "rnn"])
def test_sharded_deepspec_checkpoint_loads(varied_target, tmp_path, head):
    out, state = checkpoint(tmp_path, varied_target, head, shards=3)
    assert not (out / "model.safetensors").exists() and len(list(out.glob("model-*-of-00003.safetensors"))) == 3
    assert_same_weights(load_drafter(out, varied_target, dtype=torch.float32), state)


def test_dflash_shaped_deepspec_checkpoint_loads(varied_target, tmp_path):
    out, state = checkpoint(tmp_path, varied_target, head=None, conf=False)
    cfg = json.loads((out / "config.json").read_text())
    assert "markov_head_type" not in cfg and "confidence_head_with_markov" not in cfg
    d = load_drafter(out, varied_target, dtype=torch.float32)
    assert d.seq_head is None and d.conf_head is None
    assert_same_weights(d, state)


def test_embedding_output_tap_is_refused_in_one_line(varied_target, tmp_path):
    out, _ = checkpoint(tmp_path, varied_target)
    cfg = json.loads((out / "config.json").read_text())
    cfg["target_layer_ids"] = [-1, 0, 1]
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DrafterLoadError, match=r"config.json: target_layer_ids \[-1, 0, 1\] taps -1") as exc:
        load_drafter(out, varied_target)
    assert "\n" not in str(exc.value) and "embedding output" in str(exc.value)


def test_a_shard_the_index_names_must_exist(varied_target, tmp_path):
    out, _ = checkpoint(tmp_path, varied_target, shards=2)
    (out / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(DrafterLoadError, match="names shard 'model-00002-of-00002.safetensors', which is not a file"):
        load_drafter(out, varied_target)


def test_a_registered_layout_reader_is_what_load_drafter_uses(tiny_target, tmp_path, registered):
    """A third-party serving layout plugs in with @register("layout", name): load_drafter asks every registered
    reader whether it claims the config, places what it reads, and names the registered layouts when none does."""
    from dspark_lightning.drafters import build_drafter

    built = build_drafter(tiny_target, 3, backbone="dense", seq_head="vanilla")

    @registered("layout", "test-my-arch")
    class MyLayout:
        @staticmethod
        def claims(cfg):
            return cfg.get("architectures") == ["MyArchDraft"]

        @staticmethod
        def read(path, cfg, target):
            assert target is tiny_target and (path / "config.json").is_file()
            return built

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "config.json").write_text(json.dumps({"architectures": ["MyArchDraft"]}))
    got = load_drafter(tmp_path / "mine", tiny_target)
    assert got is built and got.source_dir == str(tmp_path / "mine") and not got.training
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text(json.dumps({"architectures": ["NobodysDraft"]}))
    with pytest.raises(DrafterLoadError, match="NobodysDraft.*dspark-hf, test-my-arch"):
        load_drafter(tmp_path / "other", tiny_target)
