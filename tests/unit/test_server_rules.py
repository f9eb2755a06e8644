"""``export --server``: each server's published loading rules, re-implemented here from its own source, load our export.

Each ``*_load`` function below takes a checkpoint's ``{tensor name: shape}`` and its config.json dict and returns what
that server would load, or raises ``ValueError`` where the server raises. They are written from the servers' code
(repository, path, commit of the copy read), never from our writer:

- vLLM ``vllm-project/vllm``: ``vllm/model_executor/models/qwen3_dspark.py`` @ 0302ff40 (``load_weights``,
  ``DSparkMarkovHead``, ``DSparkConfidenceHead``), ``vllm/model_executor/models/qwen3_dflash.py`` @ 036a00d1 (fc,
  hidden_norm, layer names), ``vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py`` @ 0cfdd2e1 (aux layer ids),
  ``vllm/v1/spec_decode/llm_base_proposer.py`` (``_init_parallel_drafting_params``: the mask token).
- SGLang ``sgl-project/sglang``: ``python/sglang/srt/models/dspark.py`` and
  ``python/sglang/srt/speculative/dspark_components/dspark_config.py`` @ 01f47623,
  ``python/sglang/srt/models/llama_eagle3.py`` @ 03d5a777, PR #25454 (EAGLE-3 aux ids). The dense backbone goes to
  ``DFlashDraftModel.load_weights`` (models/dflash.py, not read): its names are the ones of the published DSpark
  layout (docs/serving.md).
- DeepSpec ``deepseek-ai/DeepSpec``: ``deepspec/modeling/dspark/qwen3/modeling.py`` @ 5905deb7,
  ``deepspec/modeling/dspark/qwen3/config.py`` @ 041b6523, ``deepspec/modeling/dspark/common.py`` @ 3bc8dc74; its
  ``markov_head.py`` is not in the index, so the Markov head names and shapes are SGLang's port of it.
"""

import json

import pytest
import torch
from safetensors import safe_open

from dspark_lightning import create
from dspark_lightning.checkpoint import load_drafter, save_drafter
from dspark_lightning.cli import main
from dspark_lightning.export import InteropError, export_serving
from dspark_lightning.targets import load_target
from dspark_lightning.testing import random_target

RANK = 8


# --- shared by the server re-implementations ---------------------------------------------------------------------
def layer_shapes(cfg, i, prefix="layers"):
    d, H, Hkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    Dh, inter = cfg.get("head_dim") or d // H, cfg["intermediate_size"]
    p = f"{prefix}.{i}."
    return {
        p + "input_layernorm.weight": (d,),
        p + "post_attention_layernorm.weight": (d,),
        p + "self_attn.q_proj.weight": (H * Dh, d),
        p + "self_attn.k_proj.weight": (Hkv * Dh, d),
        p + "self_attn.v_proj.weight": (Hkv * Dh, d),
        p + "self_attn.o_proj.weight": (d, H * Dh),
        p + "self_attn.q_norm.weight": (Dh,),
        p + "self_attn.k_norm.weight": (Dh,),
        p + "mlp.gate_proj.weight": (inter, d),
        p + "mlp.up_proj.weight": (inter, d),
        p + "mlp.down_proj.weight": (d, inter),
    }


def backbone_shapes(cfg, n_features):
    d = cfg["hidden_size"]
    out = {"fc.weight": (d, n_features * d), "hidden_norm.weight": (d,), "norm.weight": (d,)}
    for i in range(cfg["num_hidden_layers"]):
        out.update(layer_shapes(cfg, i))
    return out


def markov_shapes(head_type, V_out, V, r, d):
    """The three heads as SGLang's models/dspark.py (DeepSpec's port) builds them: W1 (V, r), W2 (V_out, r), ..."""
    out = {"markov_head.markov_w1.weight": (V, r), "markov_head.markov_w2.weight": (V_out, r)}
    if head_type == "gated":
        out.update({"markov_head.gate_proj.weight": (r, d + r), "markov_head.gate_proj.bias": (r,)})
    if head_type == "rnn":
        out.update({"markov_head.joint_proj.weight": (3 * r, 2 * r + d), "markov_head.joint_proj.bias": (3 * r,)})
    return out


def conf_shapes(d, r, with_markov):
    return {"confidence_head.proj.weight": (1, d + (r if with_markov else 0)), "confidence_head.proj.bias": (1,)}


def check_shape(name, got, want, server):
    if tuple(got) != tuple(want):
        raise ValueError(f"{server}: {name} has shape {tuple(got)}, the model builds {tuple(want)}")


# --- vLLM --------------------------------------------------------------------------------------------------------
def vllm_aux_layers(cfg):
    """eagle3_utils.get_eagle3_aux_layers_from_config: raw eagle_aux ids, else (dflash_config.)target_layer_ids + 1.
    The target then captures the *input* of each layer id c, i.e. the output of layer c - 1."""
    ids = cfg.get("eagle_aux_hidden_state_layer_ids")
    dflash = cfg.get("dflash_config") if isinstance(cfg.get("dflash_config"), dict) else {}
    ids = ids or [i + 1 for i in (dflash.get("target_layer_ids") or [])]
    ids = ids or [i + 1 for i in (cfg.get("dspark_target_layer_ids") or [])]
    ids = ids or [i + 1 for i in (cfg.get("target_layer_ids") or [])]
    return tuple(ids) or None


def vllm_mask_token(cfg):
    """The V1 proposer's mask token, in its stricter (older) form: dflash_config.mask_token_id, pard_token or
    ptd_token_id, else ValueError (00c4f22d also falls back to a top-level mask_token_id)."""
    dflash = cfg.get("dflash_config") or {}
    for value in (dflash.get("mask_token_id"), cfg.get("pard_token"), cfg.get("ptd_token_id")):
        if value is not None:
            return int(value)
    raise ValueError("vllm: the draft config must have dflash_config.mask_token_id, pard_token or ptd_token_id")


def vllm_dspark_load(shapes, cfg, target_vocab):
    """Qwen3DSparkForCausalLM.load_weights: t2d skipped, d2t required for a reduced vocabulary, embed_tokens /
    lm_head optional (else the target's), confidence weights dropped when the head is off, every other name must be
    a parameter of the right shape (AutoWeightsLoader raises). Missing parameters are not checked (left random)."""
    V, d, r = cfg["vocab_size"], cfg["hidden_size"], int(cfg["markov_rank"])
    Vd = cfg.get("draft_vocab_size") or V
    aux = vllm_aux_layers(cfg)
    params = backbone_shapes(cfg, len(aux) if aux else cfg["num_hidden_layers"])
    params.update(markov_shapes("vanilla", Vd, V, r, d))
    conf = bool(cfg.get("enable_confidence_head", False))
    if conf:
        params.update(conf_shapes(d, r, cfg.get("confidence_head_with_markov", False)))
    optional = {"embed_tokens.weight": (V, d), "lm_head.weight": (Vd, d), "d2t": (Vd,)}
    loaded = {}
    for name, shape in shapes.items():
        if name == "t2d" or (name.startswith("confidence_head.") and not conf):
            continue
        want = params.get(name, optional.get(name))
        if want is None:
            raise ValueError(f"vllm: there is no module or parameter named {name!r} in Qwen3DSparkForCausalLM")
        check_shape(name, shape, want, "vllm")
        loaded[name] = shape
    if Vd < target_vocab and not {"lm_head.weight", "d2t"} <= set(loaded):
        raise ValueError("vllm: reduced-vocabulary Qwen3 DSpark checkpoints must include lm_head weights and d2t")
    missing = sorted(n for n in set(params) - set(loaded) if 0 not in params[n])  # a rank-0 head has no tensors
    return {"taps": [c - 1 for c in aux], "mask_token_id": vllm_mask_token(cfg), "missing": missing}


# --- SGLang ------------------------------------------------------------------------------------------------------
def sglang_dspark_load(shapes, cfg, target_vocab, ragged_mode="dynamic"):
    """models/dspark.py: markov_rank > 0 and a known markov_head_type; a confidence head unless the ragged-verify
    mode is static (with_markov defaults to markov_rank > 0), whose weights must all be present; embed_tokens /
    lm_head / rotary_emb skipped (the target's are shared); unknown Markov names raise. Backbone names go to
    DFlashDraftModel (not read): one that is no backbone parameter is reported as dropped."""
    r = int(cfg.get("markov_rank", 0))
    if r <= 0:
        raise ValueError(f"sglang: DSpark requires markov_rank > 0, got markov_rank={r}")
    head = str(cfg.get("markov_head_type")).lower()
    if head not in ("vanilla", "gated", "rnn"):
        raise ValueError(f"sglang: unsupported DSpark markov_head_type={head!r}")
    if cfg.get("speculators_model_type") == "dspark":
        raise ValueError("sglang: the speculators DSpark convention is refused")
    if cfg.get("mask_token_id") is None or int(cfg["mask_token_id"]) >= target_vocab:
        raise ValueError("sglang: DSpark requires mask_token_id inside the target vocabulary")
    V, d = cfg["vocab_size"], cfg["hidden_size"]
    ids = (cfg.get("dflash_config") or {}).get("target_layer_ids") or cfg["target_layer_ids"]
    markov = markov_shapes(head, V, V, r, d)
    conf = None if ragged_mode == "static" else conf_shapes(d, r, cfg.get("confidence_head_with_markov", r > 0))
    backbone, loaded, dropped = backbone_shapes(cfg, len(ids)), {}, []
    for name, shape in shapes.items():
        if name.startswith(("embed_tokens.", "lm_head.", "rotary_emb.")):
            continue
        group = conf if name.startswith("confidence_head.") else markov if name.startswith("markov_head.") else None
        if name.startswith("confidence_head.") and conf is None:
            continue
        if group is not None and name not in group:
            raise ValueError(f"sglang: DSpark unexpected weight {name!r} not found in model parameters")
        want = (group or backbone).get(name)
        if want is None:
            dropped.append(name)
            continue
        check_shape(name, shape, want, "sglang")
        loaded[name] = shape
    if conf is not None and not set(conf) <= set(loaded):
        raise ValueError("sglang: DSpark confidence head is enabled but the checkpoint is missing its weights")
    missing = sorted((set(backbone) | set(markov)) - set(loaded))
    return {"taps": [int(i) for i in ids], "mask_token_id": int(cfg["mask_token_id"]), "missing": missing,
            "dropped": dropped}  # fmt: skip


def sglang_capture(ids, since_25454):
    """The target's set_eagle3_layers_to_capture: c = id + 1 (always before PR #25454; since, only if ids[0] == 1),
    capturing the input of layer c = the output of layer c - 1."""
    shift = not since_25454 or ids[0] == 1
    return [(i + 1 if shift else i) - 1 for i in ids]


def sglang_eagle3_load(shapes, cfg, since_25454):
    """llama_eagle3.py: fc of 3 * target_hidden_size, midlayer.* (q/k/v and gate/up stacked), norm, lm_head of
    draft_vocab_size, d2t read as hot tokens, t2d skipped; a name that is no parameter is skipped *silently*."""
    d, dt = cfg["hidden_size"], cfg.get("target_hidden_size") or cfg["hidden_size"]
    H, Hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    Dh = cfg.get("head_dim") or d // H
    mid = {k.replace("layers.0.", "midlayer."): v for k, v in layer_shapes(cfg, 0).items() if "_norm." not in k}
    mid.update({f"midlayer.self_attn.{p}_proj.weight": (n * Dh, 2 * d) for p, n in (("q", H), ("k", Hkv), ("v", Hkv))})
    mid.update({"midlayer.input_layernorm.weight": (d,), "midlayer.hidden_norm.weight": (d,)})
    params = {**mid, "fc.weight": (d, 3 * dt), "norm.weight": (d,), "lm_head.weight": (cfg["draft_vocab_size"], d)}
    loaded, dropped = {}, []
    for name, shape in shapes.items():
        if name in ("d2t", "t2d"):
            continue
        if name not in params:
            dropped.append(name)
            continue
        check_shape(name, shape, params[name], "sglang")
        loaded[name] = shape
    ids = (cfg.get("eagle_config") or {})["eagle_aux_hidden_state_layer_ids"]
    return {"taps": sglang_capture(ids, since_25454), "missing": sorted(set(params) - set(loaded)), "dropped": dropped}


# --- DeepSpec ----------------------------------------------------------------------------------------------------
def deepspec_load(shapes, cfg):
    """Qwen3DSparkModel.from_pretrained: the required config fields, target_layer_ids in {-1} U [0, L-1] strictly
    increasing and never the final layer, then HF loading: a shape mismatch raises, absent parameters are
    *initialised at random* (a warning), unexpected tensors are ignored."""
    for key in ("target_layer_ids", "mask_token_id", "num_anchors", "enable_confidence_head", "markov_rank"):
        if key not in cfg:
            raise ValueError(f"deepspec: config.{key} must be provided")
    r, conf = int(cfg["markov_rank"]), bool(cfg["enable_confidence_head"])
    if (r > 0 and "markov_head_type" not in cfg) or (conf and "confidence_head_with_markov" not in cfg):
        raise ValueError("deepspec: markov_head_type / confidence_head_with_markov must be provided")
    ids, L = [int(i) for i in cfg["target_layer_ids"]], int(cfg["num_target_layers"])
    if any(not (i == -1 or 0 <= i < L) for i in ids) or ids != sorted(set(ids)) or L - 1 in ids:
        raise ValueError(f"deepspec: invalid target_layer_ids {ids} for {L} target layers")
    V, d = cfg["vocab_size"], cfg["hidden_size"]
    params = {**backbone_shapes(cfg, len(ids)), "embed_tokens.weight": (V, d), "lm_head.weight": (V, d)}
    if r > 0:
        params.update(markov_shapes(cfg["markov_head_type"], V, V, r, d))
    if conf:
        params.update(conf_shapes(d, r, cfg["confidence_head_with_markov"]))
    for name, shape in shapes.items():
        if name in params:
            check_shape(name, shape, params[name], "deepspec")
    return {"missing": sorted(set(params) - set(shapes)), "unexpected": sorted(set(shapes) - set(params))}


# --- fixtures ----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def targets(varied_target):
    """The 4-layer target (taps [0, 1, 2]) and 6-layer ones tapping [1, 2, 3] and [2, 3, 4] for EAGLE-3."""
    six = random_target(vocab=260, hidden=64, layers=6, init=0.3, seed=1)
    tapped = {
        ids: load_target(six.model, layer_ids=list(ids), tokenizer=six.tokenizer) for ids in ((1, 2, 3), (2, 3, 4))
    }
    return {"four": varied_target, **tapped}


def drafter(target, head="vanilla", conf=True, vocab=None):
    torch.manual_seed(0)
    if head is None:
        return create("drafter", "dflash", target, block_size=3, mask_token_id=1, backbone={"class_path": "dense",
                      "init_args": {"num_layers": 1}})  # fmt: skip
    d = create(
        "drafter",
        "dspark",
        target,
        block_size=3,
        mask_token_id=1,
        backbone={"class_path": "dense", "init_args": {"num_layers": 1}},
        seq_head={"class_path": head, "init_args": {"rank": RANK}},
        conf_head="linear" if conf else None,
        draft_vocab_size=vocab,
    )
    if vocab:
        d.set_draft_vocab(torch.arange(0, 2 * vocab, 2))
    return d.eval()


def exported(d, target, tmp_path, server=None, fmt="dspark-hf"):
    out = tmp_path / f"{fmt}-{server}"
    res = export_serving(d, target, fmt, out, server=server, overwrite=True)
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    return shapes, json.loads((out / "config.json").read_text()), res


# --- vLLM tests --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["vanilla", "dflash", "reduced"])
def test_vllm_loads_every_tensor_of_its_export_with_the_right_layers_and_mask(targets, tmp_path, kind):
    t = targets["four"]
    d = drafter(t, None if kind == "dflash" else "vanilla", vocab=40 if kind == "reduced" else None)
    shapes, cfg, _ = exported(d, t, tmp_path, "vllm")
    got = vllm_dspark_load(shapes, cfg, t.geometry.vocab_size)
    assert got["missing"] == [] and got["taps"] == list(t.geometry.layer_ids)
    assert got["mask_token_id"] == d.mask_token_id == cfg["dflash_config"]["mask_token_id"]


def test_vllm_rules_bite_on_the_generic_export(targets, tmp_path):
    t = targets["four"]
    shapes, cfg, _ = exported(drafter(t), t, tmp_path)
    with pytest.raises(ValueError, match="dflash_config.mask_token_id"):  # an older V1 proposer finds no mask token
        vllm_dspark_load(shapes, cfg, t.geometry.vocab_size)
    shapes, cfg, _ = exported(drafter(t, "gated"), t, tmp_path)
    cfg["dflash_config"] = {"mask_token_id": 1}
    with pytest.raises(ValueError, match="no module or parameter named 'markov_head.gate_proj"):
        vllm_dspark_load(shapes, cfg, t.geometry.vocab_size)


@pytest.mark.parametrize("head", ["gated", "rnn"])
def test_vllm_export_refuses_gated_and_rnn_heads_in_one_line(targets, tmp_path, head):
    with pytest.raises(InteropError, match=rf"^vllm: markov_head_type '{head}' is refused: .*; train a vanilla"):
        export_serving(drafter(targets["four"], head), targets["four"], "dspark-hf", tmp_path / "o", server="vllm")
    assert not (tmp_path / "o").exists()


# --- SGLang tests ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("head", ["vanilla", "gated", "rnn"])
def test_sglang_loads_every_tensor_of_its_export(targets, tmp_path, head):
    t = targets["four"]
    shapes, cfg, _ = exported(drafter(t, head), t, tmp_path, "sglang")
    got = sglang_dspark_load(shapes, cfg, t.geometry.vocab_size)
    assert got["missing"] == got["dropped"] == [] and got["taps"] == list(t.geometry.layer_ids)
    assert got["mask_token_id"] == 1


SGLANG_REFUSALS = [
    ({"head": None}, "markov_rank 0", "markov_rank > 0"),
    ({"vocab": 40}, "reduced draft vocabulary", r"markov_w2.weight has shape \(40, 8\)"),
    ({"conf": False}, "without a confidence head", "confidence head is enabled but the checkpoint is missing"),
]


@pytest.mark.parametrize("kw,refusal,server_error", SGLANG_REFUSALS, ids=["dflash", "reduced", "no_conf"])
def test_sglang_refusals_are_what_sglang_would_reject(targets, tmp_path, kw, refusal, server_error):
    t = targets["four"]
    with pytest.raises(InteropError, match=rf"^sglang: .*{refusal}"):
        export_serving(drafter(t, **kw), t, "dspark-hf", tmp_path / "o", server="sglang")
    shapes, cfg, _ = exported(drafter(t, **kw), t, tmp_path)  # the generic export, as SGLang would read it
    with pytest.raises(ValueError, match=server_error):
        sglang_dspark_load(shapes, cfg, t.geometry.vocab_size)


def eagle3(target):
    torch.manual_seed(0)
    return create("drafter", "eagle3", target, block_size=3)


@pytest.mark.parametrize("since_25454", [False, True])
def test_sglang_eagle3_taps_our_layers_before_and_since_pr_25454(targets, tmp_path, since_25454):
    t = targets[(1, 2, 3)]
    shapes, cfg, res = exported(eagle3(t), t, tmp_path, "sglang", fmt="eagle3-hf")
    got = sglang_eagle3_load(shapes, cfg, since_25454)
    assert got["taps"] == [1, 2, 3] and got["missing"] == [] and got["dropped"] == [] and res.notes == []
    assert [c - 1 for c in vllm_aux_layers(cfg)] == [1, 2, 3]  # the same directory is right for vLLM too
    shapes, cfg, _ = exported(eagle3(t), t, tmp_path, fmt="eagle3-hf")  # generic: vLLM's convention
    assert sglang_eagle3_load(shapes, cfg, since_25454)["taps"] == ([1, 2, 3] if since_25454 else [2, 3, 4])


def test_sglang_eagle3_other_first_layers_follow_pr_25454_or_are_refused(targets, tmp_path):
    t = targets[(2, 3, 4)]
    shapes, cfg, res = exported(eagle3(t), t, tmp_path, "sglang", fmt="eagle3-hf")
    assert sglang_eagle3_load(shapes, cfg, since_25454=True)["taps"] == [2, 3, 4]
    assert sglang_eagle3_load(shapes, cfg, since_25454=False)["taps"] == [3, 4, 5]  # what the note warns of
    assert len(res.notes) == 1 and "sglang PR #25454 and later; older SGLang adds +1" in res.notes[0]
    with pytest.raises(InteropError, match=r"^sglang: EAGLE-3 tapping layer 0 first is refused"):
        export_serving(eagle3(targets["four"]), targets["four"], "eagle3-hf", tmp_path / "o", server="sglang")


# --- DeepSpec tests ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("head", ["vanilla", "gated", "rnn", None])
def test_deepspec_export_ships_the_targets_embedding_and_head(targets, tmp_path, head):
    t = targets["four"]
    shapes, cfg, _ = exported(drafter(t, head), t, tmp_path, "deepspec")
    assert deepspec_load(shapes, cfg) == {"missing": [], "unexpected": []}
    assert cfg["rope_parameters"] == {"rope_type": "default", "rope_theta": t.geometry.rope_theta}
    shapes, cfg, _ = exported(drafter(t, head), t, tmp_path)  # generic: DeepSpec would draft with random ones
    assert deepspec_load(shapes, cfg)["missing"] == ["embed_tokens.weight", "lm_head.weight"]


def test_deepspec_export_holds_the_targets_tensors_and_loads_back(targets, tmp_path):
    t = targets["four"]
    out = tmp_path / "ds"
    export_serving(drafter(t, "rnn"), t, "dspark-hf", out, server="deepspec", dtype="fp32")
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        assert torch.equal(f.get_tensor("embed_tokens.weight"), t.embed_tokens.weight)
        assert torch.equal(f.get_tensor("lm_head.weight"), t.lm_head.weight)
    assert load_drafter(out, t).seq_head is not None
    with pytest.raises(InteropError, match=r"^deepspec: a reduced draft vocabulary is refused"):
        export_serving(drafter(t, vocab=40), t, "dspark-hf", tmp_path / "o", server="deepspec")


# --- all servers, and the command line ---------------------------------------------------------------------------
def test_one_export_for_all_servers_loads_in_each(targets, tmp_path):
    t = targets["four"]
    shapes, cfg, _ = exported(drafter(t), t, tmp_path, "all")
    assert vllm_dspark_load(shapes, cfg, 260)["missing"] == sglang_dspark_load(shapes, cfg, 260)["missing"] == []
    assert deepspec_load(shapes, cfg) == {"missing": [], "unexpected": []}
    with pytest.raises(InteropError, match="^vllm: markov_head_type 'gated'"):
        export_serving(drafter(t, "gated"), t, "dspark-hf", tmp_path / "o", server="all")


def test_cli_server_option(tiny_target, tmp_path, capsys):
    native = save_drafter(drafter(tiny_target), tmp_path / "native", tiny_target)
    main(["export", "--drafter", str(native), "--out", str(tmp_path / "v"), "--server", "vllm"])
    assert json.loads((tmp_path / "v" / "config.json").read_text())["dflash_config"] == {"mask_token_id": 1}
    with pytest.raises(SystemExit) as exc:
        main(["export", "--drafter", str(native), "--out", str(tmp_path / "x"), "--server", "tgi"])
    err = capsys.readouterr().err.splitlines()[-1]
    assert exc.value.code == 2 and err.startswith("dspark-lightning export: error: unknown server 'tgi'")


# --- a target whose embedding scales its rows (Gemma 3) ----------------------------------------------------------
@pytest.fixture(scope="module")
def gemma():
    return random_target(family="gemma3", layers=4, seed=3)


def test_gemma_drafter_blocks_embed_with_the_targets_scaled_rows(gemma):
    """The drafter reads the target's own embedding module, so Gemma's sqrt(d) scale is in its block input."""
    d = drafter(gemma)
    ids = torch.tensor([[1, 5, 9]])
    scale = gemma.model.config.hidden_size**0.5
    assert torch.allclose(d.embed(ids), gemma.model.get_input_embeddings().weight[ids] * scale, rtol=1e-5)


def test_gemma_exports_carry_the_scaled_embedding_the_drafter_reads(gemma, tmp_path):
    """DeepSpec embeds the drafter's block with its embed_tokens when the checkpoint has one (else the target's
    unscaled table): the export writes the scaled rows, and they load back as ours."""
    d = drafter(gemma)
    out = tmp_path / "deepspec"
    export_serving(d, gemma, "dspark-hf", out, server="deepspec", dtype="fp32")
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        emb = f.get_tensor("embed_tokens.weight")
    ids = torch.arange(gemma.geometry.vocab_size)
    assert torch.allclose(emb, d.embed(ids), rtol=1e-6)
    assert not torch.allclose(emb, gemma.embed_tokens.weight)
    back = load_drafter(out, gemma)
    x = torch.tensor([[3, 4, 5]])
    assert torch.equal(back.embed(x), d.embed(x))


def test_gemma_refusals_name_the_server_and_why_in_one_line(gemma, tmp_path):
    d = drafter(gemma)
    with pytest.raises(InteropError, match=r"^sglang: the target scales its token embeddings by 8 \(Gemma\)") as e:
        export_serving(d, gemma, "dspark-hf", tmp_path / "s", server="sglang")
    assert "\n" not in str(e.value)
    with pytest.raises(InteropError, match=r"^llamacpp: target architecture 'Gemma3ForCausalLM': .*inputs") as e:
        export_serving(d, gemma, "dspark-hf", tmp_path / "l", server="llamacpp")
    assert "\n" not in str(e.value) and not (tmp_path / "l").exists()
    with pytest.raises(InteropError, match=r"^vllm: target architecture 'Gemma3ForCausalLM': .*SupportsEagle3") as e:
        export_serving(d, gemma, "dspark-hf", tmp_path / "v", server="vllm")  # run: tests/slow/test_vllm.py
    assert "\n" not in str(e.value) and not (tmp_path / "v").exists()


def test_fit_refuses_a_server_that_cannot_take_the_target_before_any_data_work(gemma, tmp_path):
    from dspark_lightning.export.plan import check_servable

    d = drafter(gemma)
    check_servable(d, [], gemma)
    with pytest.raises(InteropError, match=r"^export.servers \[llamacpp\]: llamacpp: target architecture"):
        check_servable(d, ["llamacpp"], gemma)


def test_warm_start_refuses_a_target_whose_layers_are_not_the_drafters(gemma):
    from dspark_lightning.drafters.warm_start import WarmStart, warm_start

    with pytest.raises(ValueError, match="this target is 'gemma3_text'"):
        warm_start(drafter(gemma), gemma, WarmStart())


def test_vllm_export_says_when_the_targets_hidden_states_are_unchecked(tmp_path, targets, monkeypatch):
    t = targets["four"]
    _, _, res = exported(drafter(t), t, tmp_path / "a", "vllm")
    assert not any("target architecture" in n for n in res.notes)
    monkeypatch.setattr(t.model.config, "architectures", ["MistralForCausalLM"])
    _, _, res = exported(drafter(t), t, tmp_path / "b", "vllm")
    assert any("target architecture 'MistralForCausalLM'" in n and "not checked" in n for n in res.notes)


def test_a_plugin_server_is_checked_and_written_like_the_built_in_ones(targets, tmp_path, registered):
    """A third-party server registers a :class:`Server` subclass with its rules per layout: ``fit``'s check,
    ``--server NAME`` exports and ``all`` folders use its rules and additions, :meth:`Server.check` lists the reasons a
    drafter is refused, and a layout it has no rules for is refused in one line."""
    from dspark_lightning.export import Rules, Server, server_names
    from dspark_lightning.export.plan import check_servable, check_servers

    def needs_conf(drafter, target=None):
        if drafter.conf_head is None:
            raise InteropError("test-myserver: needs a confidence head")
        return ["test-myserver: loads it with a caveat"]

    def launch_keys(cfg, state, drafter):
        cfg["my_server"] = {"block": drafter.block_size}
        return []

    @registered("server", "test-myserver")
    class MyServer(Server):
        order = -1  # its rules run first among all's
        rules = {"dspark-hf": Rules(needs_conf, launch_keys)}

        def write(self, folder, drafter, target=None, job=None):
            (folder / "launch.json").write_text(json.dumps({"num_speculative_tokens": drafter.block_size}))
            return ["test-myserver: wrote launch.json"]

    t = targets["four"]
    assert "test-myserver" in server_names() and check_servers(["test-myserver"]) == ["test-myserver"]
    _, cfg, res = exported(drafter(t), t, tmp_path, "test-myserver")
    assert cfg["my_server"] == {"block": 3} and "test-myserver: loads it with a caveat" in res.notes
    assert json.loads((res.path / "launch.json").read_text()) == {"num_speculative_tokens": 3}
    assert "test-myserver: wrote launch.json" in res.notes
    no_conf = drafter(t, conf=False)
    assert MyServer().check("dspark-hf", no_conf) == ["test-myserver: needs a confidence head"]
    assert MyServer().check("dspark-hf", drafter(t)) == [] and MyServer().layouts() == ["dspark-hf"]
    with pytest.raises(InteropError, match="test-myserver: needs a confidence head"):
        check_servable(no_conf, ["test-myserver"], t)
    with pytest.raises(InteropError, match="test-myserver: needs a confidence head"):
        export_serving(no_conf, t, "dspark-hf", tmp_path / "all", server="all")
    t3 = targets[(1, 2, 3)]
    with pytest.raises(InteropError) as e:
        export_serving(eagle3(t3), t3, "eagle3-hf", tmp_path / "e", server="test-myserver")
    assert str(e.value) == "server test-myserver does not serve layout eagle3-hf (it serves: dspark-hf)"
    assert not (tmp_path / "e").exists()


def test_a_plugin_layout_brings_rules_for_a_built_in_server(targets, tmp_path, registered):
    """A layout registered from outside the package declares the rules a built-in server applies to it
    (``Layout.server_rules``): ``--server vllm`` then checks, adds and notes them; a server it brings none for refuses
    the layout in one line; the built-in layouts keep their rules."""
    from dspark_lightning.export import Layout, Rules, server_for
    from dspark_lightning.export.plan import check_servable
    from dspark_lightning.export.servers import add_for

    def vllm_check(drafter, target=None):
        if drafter.conf_head is None:
            raise InteropError("vllm: a backbone-only export without a confidence head is refused")
        return ["vllm: loads the backbone only"]

    def vllm_add(cfg, state, drafter):
        cfg["dflash_config"] = {"mask_token_id": drafter.mask_token_id}
        return ["vllm: wrote dflash_config"]

    @registered("layout", "test-backbone")
    class BackboneOnly(Layout):
        server_rules = {"vllm": Rules(vllm_check, vllm_add)}

        def build(self, drafter, target, *, dtype, server):
            state = {k: v.detach().to(dtype).clone() for k, v in drafter.state_dict().items() if "backbone." in k}
            cfg = {"architectures": ["BackboneOnly"]}
            notes = add_for("test-backbone", cfg, state, drafter, server)
            return cfg, state, {}, notes

    t = targets["four"]
    assert "test-backbone" in server_for("vllm").layouts() and "test-backbone" not in server_for("sglang").layouts()
    res = export_serving(drafter(t), t, "test-backbone", tmp_path / "v", server="vllm", dtype="fp32")
    cfg = json.loads((res.path / "config.json").read_text())
    assert cfg["dflash_config"] == {"mask_token_id": 1} and cfg["architectures"] == ["BackboneOnly"]
    assert res.notes == ["vllm: loads the backbone only", "vllm: wrote dflash_config"]
    with pytest.raises(InteropError, match="^vllm: a backbone-only export without a confidence head is refused$"):
        export_serving(drafter(t, conf=False), t, "test-backbone", tmp_path / "n", server="vllm")
    with pytest.raises(InteropError) as e:
        export_serving(drafter(t), t, "test-backbone", tmp_path / "s", server="sglang")
    assert str(e.value) == "server sglang does not serve layout test-backbone (it serves: dspark-hf, eagle3-hf)"
    assert not (tmp_path / "n").exists() and not (tmp_path / "s").exists()
    res = export_serving(drafter(t), t, "test-backbone", tmp_path / "all", server="all", dtype="fp32")
    assert "vllm: wrote dflash_config" in res.notes and any(n.startswith("no sglang files") for n in res.notes)
    _, cfg, _ = exported(drafter(t), t, tmp_path, "vllm")  # dspark-hf keeps vLLM's own rules
    assert cfg["dflash_config"] == {"mask_token_id": 1}
    check_servable(drafter(t), ["vllm", "sglang"], t)


@pytest.mark.parametrize("name", ["vllm", "sglang", "deepspec", "llamacpp"])
def test_every_built_in_server_passes_the_conformance_check(name):
    from dspark_lightning.testing import check_server

    check_server(name)


def test_the_server_conformance_check_bites(registered):
    """A server that drops a generic tensor, refuses in several lines without its name, or whose own files replace the
    layout's, fails the check."""
    from dspark_lightning.export import Rules, Server
    from dspark_lightning.testing import check_server

    def drop(cfg, state, drafter):
        state.pop(next(iter(state)))
        return []

    def mumble(drafter, target=None):
        raise InteropError("no.\nreally not")

    class Dropper(Server):
        rules = {"dspark-hf": Rules(add=drop)}

    class Mumbler(Server):
        rules = {"dspark-hf": Rules(check=mumble)}

    class Idle(Server):  # serves no layout
        pass

    class Clobberer(Server):
        rules = {"dspark-hf": Rules()}

        def write(self, folder, drafter, target=None, job=None):
            (folder / "config.json").write_text("{}")
            return []

    with pytest.raises(AssertionError, match="keep the generic layout"):
        check_server(Dropper)
    registered("server", "test-clobber")(Clobberer)
    with pytest.raises(AssertionError, match="replaced or removed the export's config.json"):
        check_server("test-clobber")
    with pytest.raises(AssertionError, match="one line naming the server"):
        check_server(Mumbler)
    with pytest.raises(AssertionError, match="serves some layout"):
        check_server(Idle)
