"""The ``LlamaForCausalLMEagle3`` layout (vLLM, SGLang, SpecForge) for our ``eagle3`` drafter (export only).

Our EAGLE-3 layer is the public one: attention input [RMSNorm(E(x)) ; RMSNorm(f)] into q/k/v of width 2d, the
un-normed fused feature f as the residual (``norm_before_residual: false``), a post-norm SwiGLU, a final norm and
an LM head; no q/k norm. Servers index the auxiliary hidden states by the *input* of a layer (id j = output of
layer j-1), ours by the output of a layer, so the ids are written +1. vLLM's loader takes ``fc`` of 3·d.
"""

from __future__ import annotations

from typing import Any

import torch

from ..drafters import ChainDrafter, Drafter
from .common import (
    InteropError,
    NameMap,
    check_layer_order,
    check_shared_head,
    geometry_keys,
    target_config,
    vocab_maps,
)

LAYOUT = "eagle3-hf"  # its registered name (layouts.py), which servers key their rules by (servers.py)
ARCH = "LlamaForCausalLMEagle3"
NAMES = NameMap(
    (
        ("fc.", "fc."),
        ("layer.token_norm.", "midlayer.input_layernorm."),
        ("layer.feature_norm.", "midlayer.hidden_norm."),
        ("layer.attn.", "midlayer.self_attn."),
        ("layer.post_norm.", "midlayer.post_attention_layernorm."),
        ("layer.mlp.", "midlayer.mlp."),
        ("layer.norm.", "norm."),
    )
)


def check_eagle3(drafter: Any, trained: bool = True) -> list[str]:
    """Raise :class:`InteropError` unless ``drafter`` is our EAGLE-3 with exactly 3 tapped layers."""
    if isinstance(drafter, Drafter):
        raise InteropError(f"a DSpark/DFlash drafter has no place in the {ARCH} layout; use --layout dspark-hf")
    if not isinstance(drafter, ChainDrafter) or drafter.kind != "eagle3":
        name = getattr(drafter, "registered_name", type(drafter).__name__)
        raise InteropError(
            f"{name} has no serving layout here: servers build MTP modules from the target's own checkpoint"
            if getattr(drafter, "kind", None) == "mtp"
            else f"{name} is not an EAGLE-3 drafter"
        )
    ids = list(drafter.geometry.layer_ids)
    if len(ids) != 3:
        raise InteropError(
            "EAGLE-3 serving loaders take fc of 3*d (exactly 3 tapped target layers); "
            f"this drafter taps {len(ids)}: {ids}"
        )
    check_layer_order(drafter.geometry.layer_ids)
    check_shared_head(drafter, trained)
    return []


def eagle3_config(drafter: ChainDrafter, target: Any, dtype: torch.dtype) -> dict[str, Any]:
    """The target's config with the EAGLE-3 keys written over it."""
    g = drafter.geometry
    aux = [i + 1 for i in g.layer_ids]  # servers: id j = the input of layer j = the output of layer j-1
    cfg = target_config(target)
    cfg.update(geometry_keys(g, 1, drafter.layer.mlp.gate_proj.out_features, dtype))
    cfg.update(
        {
            "architectures": [ARCH],
            "model_type": "llama",
            "mlp_bias": False,
            "draft_vocab_size": g.out_vocab,
            "target_hidden_size": g.hidden_size,
            "norm_before_residual": False,
            "eagle_aux_hidden_state_layer_ids": aux,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": aux, "use_aux_hidden_state": True},
        }
    )
    return cfg


def eagle3_state(drafter: ChainDrafter) -> dict[str, torch.Tensor]:
    """Weights under ``midlayer.*``, the drafter's LM head rows, and d2t/t2d for a reduced draft vocabulary."""
    state = NAMES.rename_state(drafter, ARCH)
    state["lm_head.weight"] = drafter.draft_head_weight().detach().clone()  # EAGLE-3 loaders read their own
    if drafter.draft_vocab is not None:
        state.update(vocab_maps(drafter.draft_vocab, drafter.geometry.vocab_size))
    return state
