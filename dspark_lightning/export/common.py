"""Pieces every serving layout and server shares: the refusal error, weight renames, the target-derived config.json,
the drafter's (scaled) embedding rows, dtypes, draft-vocabulary maps and the directory writer.

The serving layouts are Hugging Face style directories (``config.json`` + ``model.safetensors``) whose config
is a deep copy of the *target's* config with the drafter's keys written over it, as DeepSpec produces them.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save

from ..atomic import atomic_dir, atomic_write, recover_dir
from ..checkpoint.files import EXPORT_TAG
from ..checks import UsageError
from ..locks import LOCK_FILE

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"  # sharded checkpoints (HF save_pretrained past max_shard_size)
CONFIG_FILE = "config.json"
DEFAULT_NUM_ANCHORS = 512  # docs/algorithm.md §4; informational for serving, and our native export does not record it
CALIBRATION_FILE = "dspark_calibration.json"  # per-position STS temperatures: no server config key holds them
EXPORT_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
HF_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float32: "float32"}

# Target keys that would describe the target rather than the drafter, or contradict the keys written over them
# (a quantised target, custom code, target-side windows or RoPE scaling our drafter layers do not apply).
TARGET_ONLY_KEYS = (
    "_name_or_path",
    "auto_map",
    "quantization_config",
    "sliding_window",
    "use_sliding_window",
    "max_window_layers",
    "rope_parameters",
    "rope_scaling",
    "dtype",
    "torch_dtype",
    "transformers_version",
)


class InteropError(UsageError):
    """A drafter that a serving layout or server cannot represent faithfully; the message says why in one line."""


@dataclass(frozen=True)
class NameMap:
    """Weight-name prefixes (ours, serving); ``{i}`` stands for a layer index. Maps both ways."""

    pairs: tuple[tuple[str, str], ...]

    def to_serving(self, name: str) -> str | None:
        return self._map(name, 0, 1)

    def to_ours(self, name: str) -> str | None:
        return self._map(name, 1, 0)

    def rename_state(self, drafter: Any, arch: str) -> dict[str, torch.Tensor]:
        """``drafter``'s weights under the serving names (the draft-vocabulary buffer is written as d2t/t2d)."""
        state = {}
        for name, t in drafter.state_dict().items():
            if name == "draft_vocab":
                continue
            new = self.to_serving(name)
            if new is None:
                raise InteropError(f"weight {name!r} has no name in the {arch} layout")
            state[new] = t
        return state

    def _map(self, name: str, src: int, dst: int) -> str | None:
        for pair in self.pairs:
            m = re.match(re.escape(pair[src]).replace(r"\{i\}", r"(\d+)"), name)
            if m:
                return pair[dst].replace("{i}", m.group(1) if m.groups() else "") + name[m.end() :]
        return None


def target_config(target: Any) -> dict[str, Any]:
    """A deep copy of the target's (text) config as a dict, less the keys that describe only the target."""
    cfg = target.model.config
    if hasattr(cfg, "get_text_config"):
        cfg = cfg.get_text_config()
    d = copy.deepcopy(cfg.to_dict())
    for key in TARGET_ONLY_KEYS:
        d.pop(key, None)
    return d


def geometry_keys(g: Any, num_layers: int, intermediate_size: int, dtype: torch.dtype) -> dict[str, Any]:
    """The drafter layers' geometry: our layers copy the target's, with plain RoPE (no scaling) and SwiGLU."""
    return {
        "hidden_size": g.hidden_size,
        "intermediate_size": intermediate_size,
        "num_attention_heads": g.num_heads,
        "num_key_value_heads": g.num_kv_heads,
        "head_dim": g.head_dim,
        "rms_norm_eps": g.rms_norm_eps,
        "vocab_size": g.vocab_size,
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": False,
        "num_hidden_layers": num_layers,
        "rope_theta": g.rope_theta,
        "rope_scaling": None,
        "torch_dtype": HF_DTYPE_NAMES[dtype],
    }


def embed_scale(drafter: Any) -> float:
    """The factor the target's embedding module multiplies its rows by (Gemma: sqrt(d)); the drafter embeds its block
    tokens with that module, so a server must embed with the same scaled rows."""
    scale = getattr(drafter.embed, "embed_scale", None)
    return 1.0 if scale is None else float(scale)


def scaled_embedding(drafter: Any) -> torch.Tensor:
    """The rows the drafter's block input reads: the target's embedding times its scale (a copy)."""
    w = drafter.embed.weight.detach()
    scale = embed_scale(drafter)
    return w.clone() if scale == 1.0 else w * torch.tensor(scale, dtype=w.dtype)


def check_shared_head(drafter: Any, trained: bool = True) -> None:
    """Servers' LM heads have no bias; ours is the target's module, so a biased target head cannot be served. A
    trained drafter's reduced draft vocabulary must be set (an untrained one's is chosen from the data later)."""
    if getattr(drafter.lm_head, "bias", None) is not None:
        raise InteropError("the target's LM head has a bias; servers' draft LM heads have none")
    if trained and not drafter.vocab_ready:
        raise InteropError("the draft vocabulary is not set (draft_vocab has -1 entries): nothing to map")


def check_layer_order(layer_ids: tuple[int, ...]) -> None:
    """Servers concatenate the tapped states in layer order; ours in ``layer_ids`` order. They agree when sorted."""
    ids = list(layer_ids)
    if ids != sorted(set(ids)):
        raise InteropError(f"tapped layers {ids} are not strictly increasing; servers concatenate them in layer order")


def vocab_maps(draft_vocab: torch.Tensor, vocab_size: int) -> dict[str, torch.Tensor]:
    """EAGLE-3 style maps of a reduced draft vocabulary: ``d2t[i] = target_id(i) - i`` and the target mask ``t2d``."""
    ids = draft_vocab.detach().long().cpu()
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ids] = True
    return {"d2t": ids - torch.arange(ids.numel()), "t2d": t2d}


def draft_ids_from_d2t(d2t: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`vocab_maps`: the target id of each draft id."""
    return torch.arange(d2t.numel()) + d2t.long()


def cast_state(state: dict[str, torch.Tensor], dtype: torch.dtype, keep_fp32: tuple[str, ...] = ()) -> dict:
    """Floating tensors to ``dtype`` except names starting with ``keep_fp32``; integer and bool maps untouched."""
    out = {}
    for name, t in state.items():
        if t.is_floating_point():
            t = t.float() if name.startswith(keep_fp32) else t.to(dtype)
        out[name] = t.detach().cpu().contiguous()
    return out


def prepare_out(out: Path, overwrite: bool) -> None:
    """Refuse a non-empty directory unless ``overwrite``. Nothing is removed here: :func:`write_layout` builds the
    new export beside ``out`` and swaps it in, so a failed export leaves the previous one as it was."""
    recover_dir(out, EXPORT_TAG, "export")  # an export killed mid-swap: its previous folder comes back first
    if out.exists() and not out.is_dir():
        raise InteropError(f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise InteropError(f"output directory {out} is not empty (pass --overwrite to replace its export)")


def kept_on_overwrite(name: str) -> bool:
    """Files of a previous export in ``--out`` that an overwrite keeps: not the ones an export writes (weights,
    config, calibration side files, a stale shard index) nor a command's folder lock."""
    own = (CONFIG_FILE, WEIGHTS_FILE, INDEX_FILE, CALIBRATION_FILE, LOCK_FILE)
    return (
        name not in own
        and not name.endswith(".gguf")
        and not (name.startswith(("calibration_T", "sglang_sts_T")) and name.endswith(".json"))
    )


def write_hf(folder: Path, config: dict[str, Any], state: dict[str, torch.Tensor]) -> None:
    """``config.json`` and ``model.safetensors`` (HF's ``format: pt`` metadata) into ``folder``."""
    atomic_write(folder / WEIGHTS_FILE, save(state, metadata={"format": "pt"}))
    atomic_write(folder / CONFIG_FILE, json.dumps(config, indent=2) + "\n")


def write_layout(
    out: Path,
    config: dict[str, Any],
    state: dict[str, torch.Tensor],
    extra: dict[str, Any],
    finish: Callable[[Path], None] | None = None,
) -> None:
    """``config.json``, ``model.safetensors`` and JSON side files, built in a temp folder next to ``out`` and swapped
    in (:func:`~dspark_lightning.atomic.atomic_dir`); ``finish(tmp)`` adds more files before the swap (a GGUF)."""
    with atomic_dir(out, tag=EXPORT_TAG, what="export", carry=kept_on_overwrite) as tmp:
        write_hf(tmp, config, state)
        for name, doc in extra.items():
            atomic_write(tmp / name, json.dumps(doc, indent=1) + "\n")
        if finish is not None:
            finish(tmp)
