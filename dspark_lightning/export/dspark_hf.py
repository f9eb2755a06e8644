"""The ``Qwen3DSparkModel`` layout (DeepSpec, vLLM, SGLang) for our dense DSpark and DFlash drafters, both ways.

What maps: the dense backbone with q/k norm and full attention, the vanilla / gated / rnn heads (the same math
as the reference's ``VanillaMarkov`` / ``GatedMarkovHead`` / ``RNNHead``: gate input [h_k; W1[x]], RNN input
[s; W1[x]; h_k] split into gate, candidate, output), and the confidence head on [h_k; W1[x_{k-1}]]. Everything
else is refused by :func:`check_dspark` with the reason, rather than written with different math.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch

from ..checkpoint.files import DrafterLoadError, read_safetensors, weights_sha256
from ..checks import UsageError
from ..drafters import ConfidenceHead, DenseBackbone, Drafter, MoESWABackbone, assemble, build_part
from ..drafters.drafter import CONVENTION, check_draft_vocab
from ..layers import RMSNorm
from .common import (
    CALIBRATION_FILE,
    CONFIG_FILE,
    INDEX_FILE,
    WEIGHTS_FILE,
    InteropError,
    NameMap,
    check_layer_order,
    check_shared_head,
    draft_ids_from_d2t,
    geometry_keys,
    scaled_embedding,
    target_config,
    vocab_maps,
)

LAYOUT = "dspark-hf"  # its registered name (layouts.py), which servers key their rules by (servers.py)
ARCH = "Qwen3DSparkModel"
BASE_NAMES = (
    ("backbone.fc.", "fc."),
    ("backbone.fuse_norm.", "hidden_norm."),
    ("backbone.norm.", "norm."),
    ("backbone.layers.{i}.input_norm.", "layers.{i}.input_layernorm."),
    ("backbone.layers.{i}.post_norm.", "layers.{i}.post_attention_layernorm."),
    ("backbone.layers.{i}.attn.", "layers.{i}.self_attn."),
    ("backbone.layers.{i}.mlp.", "layers.{i}.mlp."),
    ("conf_head.proj.", "confidence_head.proj."),
)


def serving_heads() -> dict[type, str]:
    """The registered sequential heads servers know (built-in and plugins'): class -> its ``serving_type``."""
    from ..registry import get, names

    heads = (get("seq_head", n) for n in names("seq_head"))
    return {cls: cls.serving_type for cls in heads if isinstance(getattr(cls, "serving_type", None), str)}


def head_type(head: Any) -> str | None:
    """The ``markov_head_type`` of a sequential head (None: no head, or one servers do not know)."""
    return None if head is None else serving_heads().get(type(head))


def names_map(head: type | None) -> NameMap:
    """Our weight names <-> the layout's: the backbone's and confidence head's, and the sequential head class's own
    (``serving_weights``)."""
    pairs = getattr(head, "serving_weights", ())
    return NameMap((*BASE_NAMES, *((f"seq_head.{ours}", f"markov_head.{theirs}") for ours, theirs in pairs)))


SHARED = ("embed_tokens.weight", "lm_head.weight")  # optional: absent = the server shares the target's
KEEP_FP32 = ("confidence_head.",)
REQUIRED = ("num_hidden_layers", "num_target_layers", "target_layer_ids", "block_size", "mask_token_id", "vocab_size")


def is_dspark_config(cfg: dict[str, Any]) -> bool:
    arch = list(cfg.get("architectures") or [])
    return arch == [ARCH] or (arch == ["DSparkDraftModel"] and cfg.get("model_type") == "qwen3")


def _name(m: Any) -> str:
    return getattr(type(m), "registry_name", None) or type(m).__name__


# --- export ----------------------------------------------------------------------------------------------------
def check_dspark(drafter: Any, trained: bool = True) -> list[str]:
    """Raise :class:`InteropError` for a drafter whose math the layout cannot express; return notes otherwise."""
    if not isinstance(drafter, Drafter):
        name = getattr(drafter, "registered_name", type(drafter).__name__)
        hint = "; export it with --layout eagle3-hf" if name == "eagle3" else ""
        raise InteropError(f"{name} is not a DSpark/DFlash drafter: the {ARCH} layout has no place for it{hint}")
    bb, head, conf = drafter.backbone, drafter.seq_head, drafter.conf_head
    if isinstance(bb, MoESWABackbone):
        raise InteropError(
            "moe_swa backbone: servers load dense Qwen3 DSpark layers only (no MoE drafter), and its "
            "anchor-relative context windows differ from the servers' per-query windows"
        )
    if type(bb) is not DenseBackbone:
        raise InteropError(f"backbone {_name(bb)!r} has no serving mapping (only the dense backbone maps)")
    if getattr(bb, "context_state", False):
        raise InteropError(
            "backbone with context_state=true: the serving layouts have no input for the target's final hidden state "
            "(export --layout native, or train without it)"
        )
    if bb.sliding_window is not None:
        raise InteropError(
            f"dense backbone with sliding_window={bb.sliding_window}: our window is relative to the block's anchor, "
            "the servers' sliding layers window per query, so the attention would change"
        )
    if not all(isinstance(layer.attn.q_norm, RMSNorm) for layer in bb.layers):
        raise InteropError("backbone without q/k norm (qk_norm=False): Qwen3 layers always apply per-head q/k RMSNorm")
    if head is not None and head_type(head) is None:
        raise InteropError(
            f"sequential head {_name(head)!r} has no server counterpart (servers know "
            f"{list(serving_heads().values())}; a head declares serving_type and serving_weights to be exported)"
        )
    if conf is not None and type(conf) is not ConfidenceHead:
        raise InteropError(f"confidence head {_name(conf)!r} has no server counterpart")
    if conf is not None and conf.draft_features:
        raise InteropError(
            f"a confidence head that reads the draft's {' and '.join(conf.draft_features)} (draft_features) has no "
            "server counterpart: servers' heads read [h_k ; W1[x_{k-1}]] only"
        )
    if conf is not None and conf.token_dim == 0:
        raise InteropError(
            "Markov-free confidence head sigmoid(w.h_k): servers require confidence_head_with_markov=true, "
            "i.e. the input [h_k ; W1[x_{k-1}]]"
        )
    if drafter.convention != CONVENTION:
        raise InteropError(f"block convention {drafter.convention!r}: the layout's sample_from_anchor is 'shifted'")
    check_shared_head(drafter, trained)
    check_layer_order(drafter.geometry.layer_ids)
    notes = []
    if head is not None and head_type(head) != "vanilla":
        notes.append(f"markov_head_type {head_type(head)!r}: SGLang serves it, vLLM's Qwen3 DSpark path serves vanilla")
    if drafter.draft_vocab is not None:
        notes.append("reduced draft vocabulary: wrote d2t, t2d and its own lm_head rows (EAGLE-3 style)")
    return notes


def dspark_config(drafter: Drafter, target: Any, dtype: torch.dtype, num_anchors: int) -> dict[str, Any]:
    """The target's config with the DSpark keys written over it (the published DSpark layout; docs/serving.md)."""
    g, head, conf = drafter.geometry, drafter.seq_head, drafter.conf_head
    layers = drafter.backbone.layers
    cfg = target_config(target)
    cfg.update(geometry_keys(g, len(layers), layers[0].mlp.gate_proj.out_features, dtype))
    cfg.update(
        {
            "architectures": [ARCH],
            "model_type": "qwen3",
            "layer_types": ["full_attention"] * len(layers),
            "num_target_layers": g.num_layers,
            "target_layer_ids": list(g.layer_ids),
            "block_size": drafter.block_size,
            "mask_token_id": drafter.mask_token_id,
            "num_anchors": num_anchors,
            "markov_rank": head.token_dim if head is not None else 0,
            "enable_confidence_head": conf is not None,
            "confidence_head_with_markov": conf is not None,
            "draft_vocab_size": g.out_vocab,
            "sample_from_anchor": True,
        }
    )
    if head is not None:  # as DeepSpec writes it: only with a sequential head
        cfg["markov_head_type"] = head_type(head)
    return cfg


def dspark_state(drafter: Drafter, with_target_vocab: bool = False) -> dict[str, torch.Tensor]:
    """Our weights under the layout's names; a reduced vocabulary adds d2t, t2d and its lm_head rows."""
    state = names_map(type(drafter.seq_head)).rename_state(drafter, ARCH)
    if drafter.draft_vocab is not None:
        state.update(vocab_maps(drafter.draft_vocab, drafter.geometry.vocab_size))
        state["lm_head.weight"] = drafter.draft_head_weight().detach().clone()
    if with_target_vocab:  # for server builds that insist on the drafter's own copies
        state["embed_tokens.weight"] = scaled_embedding(drafter)
        state.setdefault("lm_head.weight", drafter.lm_head.weight.detach().clone())
    return state


def calibration_doc(drafter: Drafter, weights_sha256: str) -> dict[str, Any] | None:
    """The side file of per-position STS temperatures (none when the drafter carries no calibration)."""
    cals = getattr(drafter, "calibrations", None) or {}
    if not cals:
        return None
    return {
        "about": "per-position STS temperatures of the confidence head, c_k = sigmoid(z_k / T_k); no server key",
        "block_size": drafter.block_size,
        "sts_temperatures": {f"{T:g}": list(temps) for T, temps in sorted(cals.items())},
        "weights_sha256": weights_sha256,
    }


# --- import ----------------------------------------------------------------------------------------------------
def load_dspark_hf(path: Path, cfg: dict[str, Any], target: Any) -> Drafter:
    """Build our drafter from a ``Qwen3DSparkModel`` directory (weights and calibration; placement is the caller's)."""
    where = path / CONFIG_FILE
    if target is None:
        raise DrafterLoadError(f"{where}: a {ARCH} checkpoint does not name its target here; pass the target")
    try:
        missing = [k for k in REQUIRED if k not in cfg]
        if missing:
            raise UsageError(f"missing keys {missing}")
        _check_target(cfg, target)
        _check_supported(cfg)
        drafter = _build(cfg, target)
    except ValueError as exc:
        raise DrafterLoadError(f"{where}: {exc}") from None
    state, wfile = read_weights(path)
    try:
        _load_weights(drafter, state)
    except (ValueError, RuntimeError) as exc:
        msg = " ".join(str(exc).split())
        raise DrafterLoadError(f"{wfile}: {msg}") from None
    drafter.calibrations = _read_calibration(path, weights_sha256(state))
    return drafter


def read_weights(path: Path) -> tuple[dict[str, torch.Tensor], Path]:
    """All tensors of ``model.safetensors``, or of the shards ``model.safetensors.index.json`` maps (HF layout):
    each tensor from the shard the index's ``weight_map`` names for it; a tensor stored in two shards is refused
    (which copy is meant would be a guess), and so is a shard tensor the index does not name."""
    single, index = path / WEIGHTS_FILE, path / INDEX_FILE
    if single.is_file():
        return read_safetensors(single)[0], single
    if not index.is_file():
        raise DrafterLoadError(f"{path}: neither {WEIGHTS_FILE} nor {INDEX_FILE} found")
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
            raise TypeError("weight_map must map tensor names to shard file names")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DrafterLoadError(f"{index} is not a safetensors index ({exc})") from None
    state: dict[str, torch.Tensor] = {}
    found: dict[str, str] = {}
    for name in sorted(set(weight_map.values())):
        shard = path / name
        if Path(name).name != name or not shard.is_file():
            raise DrafterLoadError(f"{index} names shard {name!r}, which is not a file in {path}")
        for key, tensor in read_safetensors(shard)[0].items():
            if key in found:
                raise DrafterLoadError(f"{path}: tensor {key!r} is stored in two shards ({found[key]} and {name})")
            found[key] = name
            if weight_map.get(key) == name:
                state[key] = tensor
    unnamed = sorted(set(found) - set(weight_map))
    if unnamed:
        raise DrafterLoadError(f"{index}: tensor {unnamed[0]!r} (in {found[unnamed[0]]}) is not in its weight_map")
    missing = sorted(set(weight_map) - set(state))
    if missing:
        raise DrafterLoadError(
            f"{index} maps tensor {missing[0]!r} to {weight_map[missing[0]]}, which does not hold it"
        )
    return state, index


def _check_target(cfg: dict[str, Any], target: Any) -> None:
    tg = target.geometry
    exact = {
        "num_target_layers": tg.num_layers,
        "vocab_size": tg.vocab_size,
        "hidden_size": tg.hidden_size,
        "num_attention_heads": tg.num_heads,
        "num_key_value_heads": tg.num_kv_heads,
        "head_dim": tg.head_dim,
        "intermediate_size": tg.intermediate_size,
    }
    for key, ours in exact.items():
        if cfg.get(key) != ours:
            raise UsageError(f"{key}={cfg.get(key)} does not match the target {target.name!r} ({key}={ours})")
    rope = cfg.get("rope_parameters") or {}
    theta = cfg.get("rope_theta", rope.get("rope_theta"))
    if theta is None or abs(float(theta) - tg.rope_theta) > 1e-6 * tg.rope_theta:
        raise UsageError(f"rope_theta={theta}: our drafter layers use the target's ({tg.rope_theta})")
    if cfg.get("rope_scaling") or rope.get("rope_type", "default") != "default":
        raise UsageError("RoPE scaling is set: our drafter layers apply plain RoPE")
    if abs(float(cfg.get("rms_norm_eps", tg.rms_norm_eps)) - tg.rms_norm_eps) > 1e-12:
        raise UsageError(f"rms_norm_eps={cfg.get('rms_norm_eps')} differs from the target's ({tg.rms_norm_eps})")
    ids = [int(i) for i in cfg.get("target_layer_ids") or []]
    if -1 in ids:
        raise UsageError(
            f"target_layer_ids {ids} taps -1, DeepSpec's embedding output; our targets tap decoder-layer outputs only, "
            "so it cannot be mapped (retrain tapping decoder layers only)"
        )
    if ids != list(tg.layer_ids):
        raise UsageError(
            f"the drafter taps target layers {ids}, the target taps {list(tg.layer_ids)}: "
            f"load the target with layer_ids={ids}"
        )


def _check_supported(cfg: dict[str, Any]) -> None:
    if cfg.get("attention_bias"):
        raise UsageError("attention_bias=true: our drafter layers have no attention bias")
    if cfg.get("hidden_act", "silu") != "silu":
        raise UsageError(f"hidden_act={cfg.get('hidden_act')!r}: our drafter MLP is SwiGLU (silu)")
    if any(t != "full_attention" for t in cfg.get("layer_types") or []):
        raise UsageError(f"layer_types {cfg['layer_types']}: only full-attention drafter layers are read")
    if cfg.get("sample_from_anchor", True) is not True:
        raise UsageError("sample_from_anchor=false (the 'slot' layout): ours is the shifted convention")
    if not 0 <= int(cfg["mask_token_id"]) < int(cfg["vocab_size"]):
        raise UsageError(f"mask_token_id={cfg['mask_token_id']} is outside the vocabulary")
    rank = int(cfg.get("markov_rank") or 0)
    if rank and cfg.get("markov_head_type") not in serving_heads().values():
        raise UsageError(f"markov_head_type={cfg.get('markov_head_type')!r}: we read {list(serving_heads().values())}")
    if cfg.get("enable_confidence_head") and cfg.get("confidence_head_with_markov", True) and not rank:
        raise UsageError("confidence_head_with_markov=true needs markov_rank > 0")


def _build(cfg: dict[str, Any], target: Any) -> Drafter:
    rank = int(cfg.get("markov_rank") or 0)
    n_vocab = int(cfg.get("draft_vocab_size") or cfg["vocab_size"])
    reduced = n_vocab if n_vocab != int(cfg["vocab_size"]) else None
    registered: dict[str, str] = {}
    for cls, kind in serving_heads().items():  # the first registered head of a kind reads it (built-ins first)
        registered.setdefault(kind, cls.registry_name)
    seq_head = {"class_path": registered[cfg["markov_head_type"]], "init_args": {"rank": rank}} if rank else None
    conf_head = None
    if cfg.get("enable_confidence_head"):  # on [h_k; W1[x]] (the head's token width), or on h_k alone
        with_markov = cfg.get("confidence_head_with_markov", True)
        conf_head = "linear" if with_markov else (lambda g, _token_dim: build_part("conf_head", "linear", g, 0))
    backbone = {"class_path": "dense", "init_args": {"num_layers": int(cfg["num_hidden_layers"])}}
    return assemble(target, int(cfg["block_size"]), backbone, seq_head, conf_head, int(cfg["mask_token_id"]), reduced)


def _load_weights(drafter: Drafter, state: dict[str, torch.Tensor]) -> None:
    ours = {}
    for name, t in state.items():
        if name in SHARED or name in ("d2t", "t2d") or name.startswith("rotary_emb."):
            continue
        new = names_map(type(drafter.seq_head)).to_ours(name)
        if new is None:
            raise UsageError(f"tensor {name!r} has no counterpart in our drafter")
        ours[new] = t
    if drafter.draft_vocab is not None:
        if "d2t" not in state:
            raise UsageError("draft_vocab_size < vocab_size but no d2t tensor maps the draft vocabulary")
        ids = draft_ids_from_d2t(state["d2t"])
        check_draft_vocab(ids, drafter.draft_vocab.numel(), drafter.geometry.vocab_size)
        if "t2d" in state and not torch.equal(state["t2d"].bool(), vocab_maps(ids, drafter.geometry.vocab_size)["t2d"]):
            raise UsageError("t2d does not mark the same tokens as d2t")
        ours["draft_vocab"] = ids
    missing, unexpected = drafter.load_state_dict(ours, strict=False)
    if missing or unexpected:
        raise UsageError(f"missing tensors {sorted(missing)[:4]}, unexpected {sorted(unexpected)[:4]}")
    shared = {"embed_tokens.weight": lambda: scaled_embedding(drafter), "lm_head.weight": drafter.draft_head_weight}
    for name, ref in shared.items():
        if name in state and not _equal_up_to_rounding(state[name], ref()):
            raise UsageError(
                f"{name} differs from the target's: this drafter owns its {name.split('.')[0]}, "
                "ours share the target's (load it with the target it was trained for)"
            )


def _equal_up_to_rounding(a: torch.Tensor, ref: torch.Tensor, rows: int = 8192) -> bool:
    """Equal within bf16 rounding (relative 2^-8), compared in row chunks to bound the fp32 temporaries."""
    if a.shape != ref.shape:
        return False
    ref = ref.detach().cpu()
    return all(
        torch.allclose(a[i : i + rows].float(), ref[i : i + rows].float(), rtol=2**-7, atol=1e-6)
        for i in range(0, a.shape[0], rows)
    )


def _read_calibration(path: Path, weights_sha256: str) -> dict[float, list[float]]:
    f = path / CALIBRATION_FILE
    if not f.is_file():
        return {}
    from ..checkpoint.calibration import read_calibration_doc, sts_temperatures_of

    doc = read_calibration_doc(f)
    if doc.get("weights_sha256") != weights_sha256:
        warnings.warn(f"{f} was written for other weights; ignoring it", stacklevel=3)
        return {}
    return sts_temperatures_of(doc, f)
