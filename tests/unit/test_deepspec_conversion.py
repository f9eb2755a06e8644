"""The weight conversion of ``benchmarks/deepspec_side_by_side.py``: a DeepSpec ``Qwen3DSparkModel`` state dict and
config -> our drafter directory. No DeepSpec checkout is needed: the state dict is a fake with DeepSpec's names and
shapes (``deepspec/modeling/dspark/qwen3/modeling.py``: ``fc``, ``hidden_norm``, ``layers.i.*``, ``norm``,
``markov_head.markov_w1/markov_w2``, ``confidence_head.proj``, and the frozen ``embed_tokens`` / ``lm_head`` copies of
the target's), and the config is what its ``build_draft_config`` adds to a deep copy of the target's config.
"""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from dspark_lightning.checkpoint import load_drafter
from dspark_lightning.testing import random_target

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "deepspec_side_by_side.py"
RANK, BLOCK, MASK = 8, 4, 1


@pytest.fixture(scope="module")
def sbs():
    spec = importlib.util.spec_from_file_location("deepspec_side_by_side", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def target():
    return random_target(vocab=260, hidden=64, layers=4, seed=0)


def fake_deepspec(target, layers=1, seed=0):
    """(state dict, config) of a DeepSpec DSpark drafter for ``target``: random trained tensors, target copies."""
    tc = target.model.config
    cfg = tc.to_dict()
    cfg.update({"architectures": ["Qwen3DSparkModel"], "num_target_layers": tc.num_hidden_layers,
                "num_hidden_layers": layers, "block_size": BLOCK, "tie_word_embeddings": False,
                "layer_types": ["full_attention"] * layers, "mask_token_id": MASK,
                "target_layer_ids": list(target.geometry.layer_ids), "num_anchors": 512,
                "enable_confidence_head": True, "confidence_head_with_markov": True, "markov_rank": RANK,
                "markov_head_type": "vanilla"})  # fmt: skip
    d, V, n = tc.hidden_size, tc.vocab_size, len(target.geometry.layer_ids)
    H, Hkv, Dh, F = tc.num_attention_heads, tc.num_key_value_heads, tc.head_dim, tc.intermediate_size
    shapes = {"fc.weight": (d, n * d), "hidden_norm.weight": (d,), "norm.weight": (d,),
              "markov_head.markov_w1.weight": (V, RANK), "markov_head.markov_w2.weight": (V, RANK),
              "confidence_head.proj.weight": (1, d + RANK), "confidence_head.proj.bias": (1,)}  # fmt: skip
    for i in range(layers):
        p = f"layers.{i}."
        shapes |= {p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                   p + "self_attn.q_proj.weight": (H * Dh, d), p + "self_attn.k_proj.weight": (Hkv * Dh, d),
                   p + "self_attn.v_proj.weight": (Hkv * Dh, d), p + "self_attn.o_proj.weight": (d, H * Dh),
                   p + "self_attn.q_norm.weight": (Dh,), p + "self_attn.k_norm.weight": (Dh,),
                   p + "mlp.gate_proj.weight": (F, d), p + "mlp.up_proj.weight": (F, d),
                   p + "mlp.down_proj.weight": (d, F)}  # fmt: skip
    g = torch.Generator().manual_seed(seed)
    state = {k: torch.randn(s, generator=g) * 0.1 for k, s in shapes.items()}
    state["embed_tokens.weight"] = target.embed_tokens.weight.detach().clone()
    state["lm_head.weight"] = target.lm_head.weight.detach().clone()
    state["rotary_emb.inv_freq"] = torch.rand(Dh // 2, generator=g)
    return state, cfg


def expected_name(name):
    """Our name of a DeepSpec tensor, written out here independently of the script's map."""
    fixed = {"fc.weight": "backbone.fc.weight", "hidden_norm.weight": "backbone.fuse_norm.weight",
             "norm.weight": "backbone.norm.weight", "markov_head.markov_w1.weight": "seq_head.lr.w1.weight",
             "markov_head.markov_w2.weight": "seq_head.lr.w2.weight",
             "confidence_head.proj.weight": "conf_head.proj.weight",
             "confidence_head.proj.bias": "conf_head.proj.bias"}  # fmt: skip
    if name in fixed:
        return fixed[name]
    i, rest = name.removeprefix("layers.").split(".", 1)
    for a, b in (("input_layernorm.", "input_norm."), ("post_attention_layernorm.", "post_norm."),
                 ("self_attn.", "attn.")):  # fmt: skip
        if rest.startswith(a):
            rest = b + rest.removeprefix(a)
    return f"backbone.layers.{i}.{rest}"


def test_conversion_maps_every_tensor_and_writes_our_format(sbs, target, tmp_path):
    state, cfg = fake_deepspec(target, layers=2)
    drafter, report = sbs.convert_deepspec_state(state, cfg, target, out=tmp_path / "drafter")
    trained = {k: v for k, v in state.items() if k not in ("embed_tokens.weight", "lm_head.weight")}
    trained.pop("rotary_emb.inv_freq")
    assert report["mapped"] == {k: expected_name(k) for k in trained}
    assert report["shared_with_target"] == ["embed_tokens.weight", "lm_head.weight"]
    assert report["dropped"] == ["rotary_emb.inv_freq"]
    ours = drafter.state_dict()
    assert set(ours) == {expected_name(k) for k in trained}  # nothing of ours left without a DeepSpec tensor
    for name, t in trained.items():
        assert ours[expected_name(name)].shape == t.shape and torch.equal(ours[expected_name(name)], t), name
    assert drafter.block_size == BLOCK and drafter.mask_token_id == MASK and len(drafter.backbone.layers) == 2
    assert drafter.seq_head.token_dim == RANK and drafter.embed is target.embed_tokens  # shared, not copied
    again = load_drafter(tmp_path / "drafter", target)  # our own format: reloads with the same weights
    assert all(torch.equal(again.state_dict()[k], v) for k, v in ours.items())
    saved = json.loads((tmp_path / "drafter" / "config.json").read_text())
    assert saved["imported_from"]["layout"] == "DeepSpec Qwen3DSparkModel"


def _bad_config(key, value):
    def edit(state, cfg):
        cfg[key] = value

    return edit


def _bad_tensor(name, shape):
    def edit(state, cfg):
        state[name] = torch.zeros(shape)

    return edit


def _other_embedding(state, cfg):
    state["embed_tokens.weight"] = state["embed_tokens.weight"] + 1.0


def _extra_tensor(state, cfg):
    state["markov_head.extra_proj.weight"] = torch.zeros(2, 2)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_bad_config("hidden_size", 32), r"hidden_size=32 does not match the target"),
        (_bad_config("num_target_layers", 7), r"num_target_layers=7 does not match the target"),
        (_bad_config("vocab_size", 300), r"vocab_size=300 does not match the target"),
        (_bad_config("target_layer_ids", [0, 1, 3]), r"taps target layers \[0, 1, 3\], the target taps \[0, 1, 2\]"),
        (_bad_tensor("fc.weight", (64, 4 * 64)), r"size mismatch for backbone\.fc\.weight"),
        (_bad_tensor("markov_head.markov_w1.weight", (260, 16)), r"size mismatch for seq_head\.lr\.w1\.weight"),
        (_other_embedding, r"embed_tokens\.weight differs from the target's"),
        (_extra_tensor, r"'markov_head\.extra_proj\.weight' has no counterpart"),
    ],
)
def test_conversion_refuses_another_geometry_in_one_line(sbs, target, tmp_path, edit, message):
    state, cfg = fake_deepspec(target)
    edit(state, cfg)
    with pytest.raises(sbs.DeepSpecImportError, match=message) as exc:
        sbs.convert_deepspec_state(state, cfg, target, out=tmp_path / "drafter")
    assert "\n" not in str(exc.value) and "does not fit target" in str(exc.value)
    assert not (tmp_path / "drafter").exists()  # nothing written for a refused checkpoint
