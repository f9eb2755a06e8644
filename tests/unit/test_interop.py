"""Serving export / import (dspark_lightning.export): exact layouts, faithful round trips, one-line refusals."""

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from dspark_lightning import create
from dspark_lightning.checkpoint import DrafterLoadError, load_drafter, read_config, save_drafter
from dspark_lightning.cli import main
from dspark_lightning.drafters import VanillaMarkovHead
from dspark_lightning.export import InteropError, export_drafter, export_serving
from dspark_lightning.export.common import TARGET_ONLY_KEYS
from dspark_lightning.testing import assert_decodes_target_greedy

RANK = 16
LAYER_KEYS = (
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
)
BASE = {"fc.weight", "hidden_norm.weight", "norm.weight"} | {f"layers.{i}.{k}" for i in range(2) for k in LAYER_KEYS}
MARKOV = {"markov_head.markov_w1.weight", "markov_head.markov_w2.weight"}
CONF = {"confidence_head.proj.weight", "confidence_head.proj.bias"}
HEAD_KEYS = {
    "vanilla": MARKOV | CONF,
    "gated": MARKOV | CONF | {"markov_head.gate_proj.weight", "markov_head.gate_proj.bias"},
    "rnn": MARKOV | CONF | {"markov_head.joint_proj.weight", "markov_head.joint_proj.bias"},
}


def parallel(target, name="dspark", layers=2, seed=0, **kw):
    """A registered parallel drafter with every weight perturbed (norms != 1, biases != 0: mix-ups would show)."""
    torch.manual_seed(seed)
    kw.setdefault("backbone", {"class_path": "dense", "init_args": {"num_layers": layers}})
    if name == "dspark":
        kw.setdefault("seq_head", {"class_path": "vanilla", "init_args": {"rank": RANK}})
    d = create("drafter", name, target, block_size=3, mask_token_id=1, **kw)
    with torch.no_grad():
        for p in d.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return d.eval()


@pytest.fixture(scope="module")
def batch(varied_target):
    ids = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(0))
    out = varied_target(ids)
    return out.context, ids, torch.tensor([[3, 9, 15], [5, 11, 0]]), torch.tensor([[1, 1, 1], [1, 1, 0]]).bool()


@torch.no_grad()
def run(drafter, batch):
    return drafter(*batch)


def export_dir(drafter, target, tmp_path, **kw):
    save_drafter(drafter, tmp_path / "native", target)
    export_drafter(tmp_path / "native", kw.pop("fmt", "dspark-hf"), tmp_path / "hf", target=target, **kw)
    return tmp_path / "hf"


@pytest.mark.parametrize("head", ["vanilla", "gated", "rnn"])
def test_fp32_round_trip_gives_identical_logits_and_confidences(varied_target, batch, tmp_path, head):
    d = parallel(varied_target, seq_head={"class_path": head, "init_args": {"rank": RANK}})
    back = load_drafter(export_dir(d, varied_target, tmp_path, dtype="fp32"), varied_target)
    a, b = run(d, batch), run(back, batch)
    assert torch.equal(a.logits, b.logits) and torch.equal(a.conf_logits, b.conf_logits)


def test_bf16_export_rounds_weights_only_and_keeps_the_confidence_head_fp32(varied_target, batch, tmp_path):
    d = parallel(varied_target, seq_head={"class_path": "rnn", "init_args": {"rank": RANK}})
    out = export_dir(d, varied_target, tmp_path)  # default dtype: bf16
    state = load_file(str(out / "model.safetensors"))
    assert {n for n, t in state.items() if t.dtype == torch.float32} == CONF
    assert all(t.dtype == torch.bfloat16 for n, t in state.items() if n not in CONF)
    rounded = parallel(varied_target, seq_head={"class_path": "rnn", "init_args": {"rank": RANK}})
    with torch.no_grad():
        for name, p in rounded.named_parameters():
            if not name.startswith("conf_head."):
                p.copy_(p.to(torch.bfloat16).float())
    back, ref = run(load_drafter(out, varied_target), batch), run(rounded, batch)
    assert torch.equal(back.logits, ref.logits) and torch.equal(back.conf_logits, ref.conf_logits)
    exact = run(d, batch)
    assert not torch.equal(back.logits, exact.logits)
    scale = exact.logits.abs().max().item()  # bf16 weights: small errors relative to the logits' range
    torch.testing.assert_close(back.logits, exact.logits, rtol=0, atol=0.02 * scale)


def expected_config(target, head, draft_vocab=None):
    g = target.geometry
    cfg = {
        "architectures": ["Qwen3DSparkModel"],
        "model_type": "qwen3",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": g.rms_norm_eps,
        "vocab_size": 260,
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": False,
        "num_hidden_layers": 2,
        "layer_types": ["full_attention"] * 2,
        "rope_theta": g.rope_theta,
        "rope_scaling": None,
        "torch_dtype": "bfloat16",
        "num_target_layers": 4,
        "target_layer_ids": [0, 1, 2],
        "block_size": 3,
        "mask_token_id": 1,
        "num_anchors": 512,
        "markov_rank": RANK if head else 0,
        "enable_confidence_head": bool(head),
        "confidence_head_with_markov": bool(head),
        "draft_vocab_size": draft_vocab or 260,
        "sample_from_anchor": True,
    }
    if head:
        cfg["markov_head_type"] = head
    return cfg


def check_config(cfg, target, expected):
    assert {k: cfg.get(k) for k in expected} == expected
    tcfg = json.loads(json.dumps(target.model.config.to_dict()))
    kept = set(tcfg) - set(TARGET_ONLY_KEYS) - set(expected)
    assert set(cfg) == kept | set(expected)  # the target's own keys, plus exactly the DSpark keys
    assert all(cfg[k] == tcfg[k] for k in kept)


@pytest.mark.parametrize("head", ["vanilla", "gated", "rnn", None])
def test_key_set_and_config_match_the_interop_table(varied_target, tmp_path, head):
    d = (
        parallel(varied_target, "dflash")
        if head is None
        else parallel(varied_target, seq_head={"class_path": head, "init_args": {"rank": RANK}})
    )
    out = export_dir(d, varied_target, tmp_path)
    assert set(load_file(str(out / "model.safetensors"))) == BASE | HEAD_KEYS.get(head, set())
    check_config(read_config(out), varied_target, expected_config(varied_target, head))
    assert not (out / "dspark_calibration.json").exists()


def test_reduced_draft_vocabulary_ships_d2t_t2d_and_its_lm_head_rows(varied_target, batch, tmp_path):
    d = parallel(varied_target, draft_vocab_size=40)
    ids = torch.randperm(260, generator=torch.Generator().manual_seed(1))[:40].sort().values
    d.set_draft_vocab(ids)
    out = export_dir(d, varied_target, tmp_path, dtype="fp32")
    state = load_file(str(out / "model.safetensors"))
    assert set(state) == BASE | MARKOV | CONF | {"d2t", "t2d", "lm_head.weight"}
    assert torch.equal(state["d2t"], ids - torch.arange(40)) and state["t2d"].sum() == 40 and state["t2d"][ids].all()
    assert torch.equal(state["lm_head.weight"], varied_target.lm_head.weight[ids])
    assert state["markov_head.markov_w2.weight"].shape == (40, RANK)
    check_config(
        read_config(out), varied_target, {**expected_config(varied_target, "vanilla", 40), "torch_dtype": "float32"}
    )
    back = load_drafter(out, varied_target)
    assert torch.equal(back.draft_vocab, ids) and torch.equal(run(back, batch).logits, run(d, batch).logits)


REFUSALS = [
    (
        {"backbone": {"class_path": "moe_swa", "init_args": {"num_layers": 1, "num_experts": 2, "top_k": 1}}},
        "moe_swa backbone: servers",
    ),
    (
        {"backbone": {"class_path": "dense", "init_args": {"num_layers": 1, "sliding_window": 4}}},
        "sliding_window=4: our window",
    ),
    (
        {"backbone": {"class_path": "dense", "init_args": {"num_layers": 1, "context_state": True}}},
        "context_state=true: the serving",
    ),
    ({"backbone": {"class_path": "dense", "init_args": {"num_layers": 1, "qk_norm": False}}}, "without q/k norm"),
    ({"seq_head": None}, "confidence_head_with_markov=true"),
]


@pytest.mark.parametrize(
    "kw,reason", REFUSALS, ids=["moe_swa", "swa", "context_state", "no_qk_norm", "markov_free_conf"]
)
def test_unmappable_dspark_drafters_are_refused(varied_target, tmp_path, kw, reason):
    with pytest.raises(InteropError, match=reason):
        export_serving(parallel(varied_target, **kw), varied_target, "dspark-hf", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_unknown_head_subclass_and_other_families_are_refused(varied_target, tiny_target, tmp_path):
    class Tweaked(VanillaMarkovHead):  # same weights, possibly different math: never exported as vanilla
        pass

    d = parallel(varied_target)
    d.seq_head = Tweaked(d.geometry, rank=RANK)
    cases = [
        (d, "dspark-hf", "has no server counterpart"),
        (create("drafter", "eagle3", varied_target, block_size=3), "dspark-hf", "export it with --layout eagle3-hf"),
        (create("drafter", "mtp1", varied_target), "eagle3-hf", "MTP modules"),
        (create("drafter", "eagle3", tiny_target, block_size=3), "eagle3-hf", r"exactly 3 tapped.*taps 5"),
        (parallel(varied_target), "eagle3-hf", "use --layout dspark-hf"),
    ]
    for drafter, fmt, reason in cases:
        with pytest.raises(InteropError, match=reason):
            export_serving(drafter, varied_target, fmt, tmp_path / "out")


def test_cli_refusal_is_one_line_and_exit_code_2(tiny_target, tmp_path, capsys):
    d = parallel(
        tiny_target, backbone={"class_path": "moe_swa", "init_args": {"num_layers": 1, "num_experts": 2, "top_k": 1}}
    )
    save_drafter(d, tmp_path / "native", tiny_target)
    with pytest.raises(SystemExit) as exc:
        main(["export", "--drafter", str(tmp_path / "native"), "--layout", "dspark-hf", "--out", str(tmp_path / "o")])
    lines = capsys.readouterr().err.splitlines()  # (HF may print a weight-loading progress bar first)
    assert exc.value.code == 2 and lines[-1].startswith("dspark-lightning export: error: moe_swa backbone")
    assert sum("error" in line for line in lines) == 1 and not (tmp_path / "o").exists()


def test_cli_writes_sts_side_file_and_notes_and_it_loads_back(tiny_target, tmp_path, capsys):
    d = parallel(tiny_target, seq_head={"class_path": "gated", "init_args": {"rank": RANK}})
    native = save_drafter(d, tmp_path / "native", tiny_target)
    temps = [1.5, 2.0, 2.5]
    doc = {"temperatures": temps, "sampling_temperature": 1.0, "weights_sha256": read_config(native)["weights_sha256"]}
    (native / "calibration_T1.json").write_text(json.dumps(doc))
    main(["export", "--drafter", str(native), "--out", str(tmp_path / "hf")])
    out = capsys.readouterr().out
    assert "(dspark-hf, bf16," in out and "dspark_calibration.json" in out and "'gated': SGLang serves it" in out
    side = json.loads((tmp_path / "hf" / "dspark_calibration.json").read_text())
    assert side["sts_temperatures"] == {"1": temps}
    assert load_drafter(tmp_path / "hf", tiny_target).calibrations == {1.0: temps}
    main(["export", "--drafter", str(tmp_path / "hf"), "--layout", "native", "--out", str(tmp_path / "back"),
          "--target", "tiny-debug"])  # fmt: skip
    assert read_config(tmp_path / "back")["seq_head"]["class_path"] == "gated"
    with pytest.raises(SystemExit):  # an existing export is not overwritten silently
        main(["export", "--drafter", str(native), "--out", str(tmp_path / "hf")])
    assert "is not empty (pass --overwrite" in capsys.readouterr().err
    main(["export", "--drafter", str(native), "--out", str(tmp_path / "hf"), "--overwrite", "true", "--dtype", "fp32"])
    assert read_config(tmp_path / "hf")["torch_dtype"] == "float32"


def test_export_command_does_not_import_lightning(tiny_target, tmp_path):
    native = save_drafter(parallel(tiny_target), tmp_path / "native", tiny_target)
    code = (
        "import sys; from dspark_lightning.cli import main; main(sys.argv[1:]); "
        "assert not [m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning')], 'lightning'"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    args = [sys.executable, "-c", code, "export", "--drafter", str(native), "--out", str(tmp_path / "hf")]
    res = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert (tmp_path / "hf" / "model.safetensors").is_file()


@pytest.mark.parametrize("key", ["num_target_layers", "vocab_size", "hidden_size"])
def test_import_refuses_a_mismatched_target_naming_the_file(varied_target, tmp_path, key):
    out = export_dir(parallel(varied_target), varied_target, tmp_path)
    cfg = read_config(out)
    cfg[key] += 1
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DrafterLoadError, match=rf"config.json: {key}={cfg[key]} does not match the target"):
        load_drafter(out, varied_target)


def test_import_of_deepspec_shaped_checkpoints(varied_target, batch, tmp_path):
    d = parallel(varied_target)
    vocab = {"class_path": "dspark-hf", "init_args": {"with_target_vocab": True}}  # ships embed/lm_head copies
    out = export_dir(d, varied_target, tmp_path, dtype="fp32", fmt=vocab)
    cfg = read_config(out)
    cfg["architectures"] = ["DSparkDraftModel"]
    del cfg["sample_from_anchor"]  # DeepSpec does not write it: the shifted convention is its only one
    (out / "config.json").write_text(json.dumps(cfg))
    assert torch.equal(run(load_drafter(out, varied_target), batch).logits, run(d, batch).logits)
    with pytest.raises(DrafterLoadError, match="pass the target"):
        load_drafter(out)
    cfg["target_layer_ids"] = [0, 2]
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DrafterLoadError, match=r"load the target with layer_ids=\[0, 2\]"):
        load_drafter(out, varied_target)
    cfg["target_layer_ids"] = [0, 1, 2]
    (out / "config.json").write_text(json.dumps(cfg))
    state = load_file(str(out / "model.safetensors"))
    state["embed_tokens.weight"] = state["embed_tokens.weight"] + 0.01  # a drafter with its own embedding
    save_file(state, str(out / "model.safetensors"))
    with pytest.raises(DrafterLoadError, match="model.safetensors: embed_tokens.weight differs from the target's"):
        load_drafter(out, varied_target)


def test_loaded_dspark_hf_decodes_the_targets_greedy_output(varied_target, tmp_path):
    target = varied_target
    out = export_dir(parallel(target, layers=1), target, tmp_path)  # bf16, as served
    drafter = load_drafter(out, target)
    assert_decodes_target_greedy(target, drafter)


def test_eagle3_export_layout(varied_target, tmp_path):
    torch.manual_seed(0)
    d = create("drafter", "eagle3", varied_target, block_size=3, draft_vocab_size=32)
    ids = torch.arange(0, 256, 8)
    d.set_draft_vocab(ids)
    res = export_serving(d, varied_target, "eagle3-hf", tmp_path / "e3")
    state, cfg = load_file(str(tmp_path / "e3" / "model.safetensors")), read_config(tmp_path / "e3")
    mid = {f"midlayer.{k}" for k in LAYER_KEYS if "_norm." not in k} | {"midlayer.hidden_norm.weight"}
    assert set(state) == mid | {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"}
    assert state["fc.weight"].shape == (64, 3 * 64) and state["midlayer.self_attn.q_proj.weight"].shape == (64, 128)
    assert state["lm_head.weight"].shape == (32, 64) and torch.equal(state["d2t"], ids - torch.arange(32))
    assert all(t.dtype == torch.bfloat16 for t in state.values() if t.is_floating_point())
    expected = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "num_hidden_layers": 1,
        "draft_vocab_size": 32,
        "vocab_size": 260,
        "target_hidden_size": 64,
        "norm_before_residual": False,
        "eagle_aux_hidden_state_layer_ids": [1, 2, 3],  # servers' ids count the embedding output as 0
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3], "use_aux_hidden_state": True},
    }
    assert {k: cfg[k] for k in expected} == expected and res.tensors == len(state)


def eagle3_reference(sd, cfg, target, context, ids):
    """The public EAGLE-3 layer written from the exported tensors alone (step 0, causal over the sequence)."""
    eps, H, Hkv, Dh = cfg["rms_norm_eps"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    W = {k: v.float() for k, v in sd.items()}

    def rms(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def heads(x, name, n):
        return (x @ W[f"midlayer.self_attn.{name}.weight"].T).view(B, S, n, Dh).transpose(1, 2)

    f = context @ W["fc.weight"].T  # (B, S, d) fused aux hidden states
    emb = target.embed_tokens(torch.cat([ids[:, 1:], ids[:, -1:]], 1))  # token x_{t+1} pairs with feature t
    x = torch.cat([rms(emb, W["midlayer.input_layernorm.weight"]), rms(f, W["midlayer.hidden_norm.weight"])], -1)
    B, S, _ = x.shape
    ang = torch.arange(S).float()[:, None] / cfg["rope_theta"] ** (torch.arange(0, Dh, 2).float() / Dh)
    ang = torch.cat([ang, ang], -1)

    def rope(t):
        return t * ang.cos() + torch.cat([-t[..., Dh // 2 :], t[..., : Dh // 2]], -1) * ang.sin()

    q, k, v = rope(heads(x, "q_proj", H)), rope(heads(x, "k_proj", Hkv)), heads(x, "v_proj", Hkv)
    k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
    a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, S, -1)
    h = f + a @ W["midlayer.self_attn.o_proj.weight"].T  # residual: the un-normed fused feature
    m = rms(h, W["midlayer.post_attention_layernorm.weight"])
    mlp = torch.nn.functional.silu(m @ W["midlayer.mlp.gate_proj.weight"].T) * (m @ W["midlayer.mlp.up_proj.weight"].T)
    h = h + mlp @ W["midlayer.mlp.down_proj.weight"].T
    return rms(h, W["norm.weight"]) @ W["lm_head.weight"].T  # (B, S, V)


@torch.no_grad()
def test_eagle3_export_computes_the_public_eagle3_layer(varied_target, batch, tmp_path):
    torch.manual_seed(0)
    d = create("drafter", "eagle3", varied_target, block_size=3)
    for p in d.parameters():
        p.add_(0.1 * torch.randn_like(p))  # norms != 1: a swapped norm would show
    export_serving(d, varied_target, "eagle3-hf", tmp_path / "e3", dtype="fp32")
    sd, cfg = load_file(str(tmp_path / "e3" / "model.safetensors")), read_config(tmp_path / "e3")
    context, ids, anchors, valid = batch
    ref = eagle3_reference(sd, cfg, varied_target, context, ids)  # (B, S, V)
    ours = d(context, ids, anchors, valid).logits[:, :, 0]  # step 0 of anchor a reads position a - 1
    for b, a in valid.nonzero().tolist():
        torch.testing.assert_close(ours[b, a], ref[b, anchors[b, a] - 1], rtol=1e-4, atol=1e-4)
