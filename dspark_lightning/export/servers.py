"""Per-server exports: what each server reads beyond the generic layout, and what it would load wrongly. A *server*
is any program that loads an exported drafter to decode with it: vLLM, SGLang, llama.cpp, DeepSpec's model code.

``export --server vllm|sglang|deepspec|llamacpp|all`` starts from the generic ``dspark-hf`` / ``eagle3-hf`` export and
applies that server's rules; ``all`` applies every rule at once (one directory every server loads, where one
exists). The rules, and the server source each was read from, are tabled in docs/serving.md:

- vLLM (``qwen3_dspark.py``, ``llm_base_proposer.py``): no gated / rnn head weights (its loader raises on
  them); ``dflash_config.mask_token_id`` (older V1 proposers read the mask token only there).
- SGLang (``models/dspark.py``, ``llama_eagle3.py``, PR #25454): ``markov_rank > 0``; ``markov_w2`` of
  (vocab_size, r); a confidence head (built in every ragged-verify mode but static); EAGLE-3 aux ids in its
  own convention (the target adds +1: always before PR #25454, since then only when the first id is 1); the STS
  table its ``--speculative-dspark-confidence-sts-path`` loads (``dspark_components/dspark_sts.py``), one file per
  calibrated sampling temperature.
- DeepSpec (``modeling/dspark/qwen3/``): the target's ``embed_tokens`` / ``lm_head`` saved in the checkpoint
  (``from_pretrained`` initialises absent ones at random), the full vocabulary, ``rope_parameters``.
- llama.cpp (b11434: ``conversion/qwen.py`` ``DSparkModel``, ``src/models/dflash.cpp``): a vanilla Markov head (its
  converter raises on others), a Markov head at all (``--spec-type draft-dspark`` asserts its weights), a reduced
  vocabulary as ``d2t``; the GGUF itself is its converter's output (llamacpp.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..atomic import atomic_write
from ..registry import get, names, register
from .common import InteropError

SGLANG_PR = "sglang PR #25454"
ALL = "all"  # every server at once: one folder the servers ``in_all`` load, or a refusal


@dataclass(frozen=True)
class ExportJob:
    """What a serving export was asked for, as a server's :meth:`Server.write` may need it."""

    dtype: str = "bf16"  # the export's precision (``bf16`` / ``fp32``)
    num_anchors: int = 512
    target_gguf: bool = False  # llama.cpp: also the target's own GGUF
    strict: bool = True  # False in an ``all`` folder: files a server cannot write become a note, the folder stays
    out: Path | None = None  # the export's final folder (``write`` builds it elsewhere): notes name files there


class Server:
    """A program that loads an exported drafter (register one with ``@register("server", name)``). The hooks do
    nothing by default, like a Lightning ``Callback``: a server overrides the ones its loader needs.

    - :meth:`dspark_rules` / :meth:`eagle3_rules`: raise :class:`InteropError` for what the server would load wrongly
      or reject (naming the server and the option), return notes for what it loads with a caveat;
    - :meth:`dspark_additions` / :meth:`eagle3_additions`: the config keys and tensors it reads beyond the generic
      ``dspark-hf`` / ``eagle3-hf`` layout, written in place;
    - :meth:`write`: files of its own it reads beside the layout's (a launch config, llama.cpp's GGUF), written into
      the export folder before it is swapped in;
    - :meth:`check`: the reasons a drafter cannot be served (empty: it can).
    """

    in_all = True  # ``--server all`` folders must satisfy this server's rules; if False, they get its files only
    # where its rules pass (a note says why not)
    order = 100  # where its rules run among ``all``'s (the first refusal is the one reported)

    @property
    def name(self) -> str:
        return getattr(type(self), "registry_name", type(self).__name__)

    def dspark_rules(self, drafter: Any, head_type: str | None, target: Any = None) -> list[str]:
        return []

    def dspark_additions(self, cfg: dict[str, Any], state: dict[str, torch.Tensor], drafter: Any) -> None:
        return None

    def eagle3_rules(self) -> None:
        return None

    def eagle3_additions(self, cfg: dict[str, Any], layer_ids: list[int]) -> list[str]:
        return []

    def write(self, folder: Path, drafter: Any, target: Any = None, job: ExportJob | None = None) -> list[str]:
        """Write the files this server reads beyond the layout's into ``folder`` (the export being built); return
        notes. It must not replace the layout's own files (``config.json``, the weights, the calibration file)."""
        return []

    def check(self, drafter: Any, target: Any = None) -> list[str]:
        """Why ``drafter`` (trained or not) cannot be exported for this server: an empty list when it can."""
        from .dspark_hf import head_type

        try:
            if hasattr(drafter, "seq_head"):
                self.dspark_rules(drafter, head_type(drafter.seq_head), target)
            else:
                self.eagle3_rules()
        except InteropError as exc:
            return [str(exc)]
        return []


def server_names() -> list[str]:
    """The registered servers (built-in: deepspec, llamacpp, sglang, vllm; plugins may add more)."""
    return names("server")


def server_for(name: str) -> Server:
    """The registered server ``name``."""
    return get("server", name)()


def check_server(name: str | None) -> None:
    if name is not None and name != ALL and name not in server_names():
        choices = ", ".join([*server_names(), ALL])
        raise InteropError(f"unknown server {name!r}; choose from {choices} (or none: generic)")


def wanted(name: str | None) -> tuple[Server, ...]:
    """The servers whose rules must pass: ``name``'s, or for ``all`` those ``in_all``."""
    if name is None:
        return ()
    if name == ALL:
        return tuple(sorted((s for s in map(server_for, server_names()) if s.in_all), key=lambda s: (s.order, s.name)))
    return (server_for(name),)


def writers(name: str | None, drafter: Any, target: Any = None) -> tuple[list[Server], list[str]]:
    """The servers whose :meth:`Server.write` runs on the export, and notes: ``name``'s, or for ``all`` those
    ``in_all`` plus the others whose rules pass this drafter (a note names each left out and why)."""
    if name != ALL:
        return list(wanted(name)), []
    out, notes = list(wanted(ALL)), []
    for s in sorted((s for s in map(server_for, server_names()) if not s.in_all), key=lambda s: (s.order, s.name)):
        why = s.check(drafter, target)
        if why:
            notes.append(f"no {s.name} files in this all-servers folder: {why[0]}")
        else:
            out.append(s)
    return out, notes


# --- dspark-hf --------------------------------------------------------------------------------------------------
def refuse_dspark(drafter: Any, head_type: str | None, server: str | None, target: Any = None) -> list[str]:
    """Raise :class:`InteropError` naming the server for what it would load wrongly or reject; return notes.
    ``target`` (when known) adds the rules about the target itself (its architecture in llama.cpp)."""
    notes = []
    for s in wanted(server):
        notes += s.dspark_rules(drafter, head_type, target)
    return notes


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


@register("server", "vllm")
class VLLM(Server):
    """vLLM (``qwen3_dspark.py``, ``llm_base_proposer.py``)."""

    order = 0

    def dspark_rules(self, drafter: Any, head_type: str | None, target: Any = None) -> list[str]:
        if head_type in ("gated", "rnn"):
            raise InteropError(
                f"vllm: markov_head_type {head_type!r} is refused: vLLM's Qwen3 DSpark loader has no "
                f"markov_head.{'gate_proj' if head_type == 'gated' else 'joint_proj'} and raises on it; "
                "train a vanilla head or export with --server sglang"
            )
        arch = target_arch(target)
        if arch in VLLM_NO_AUX_STATES:
            raise InteropError(
                f"vllm: target architecture {arch!r}: vLLM {VLLM_VERSION}'s {VLLM_NO_AUX_STATES[arch]} does not "
                "implement SupportsEagle3, so it emits none of the hidden states a DSpark drafter taps (vLLM raises "
                "'Model does not support EAGLE3 interface' on load); serve this drafter with "
                "dspark_lightning.infer.decode, or export with --server deepspec"
            )
        notes = []
        if embed_scale(drafter) != 1.0:
            notes.append(
                f"vllm: the target scales its token embeddings by {embed_scale(drafter):.4g}: wrote the scaled rows as "
                "embed_tokens, which vLLM's Qwen3 DSpark loads as its own instead of sharing the target's"
            )
        if head_type is None:
            notes.append("vllm: markov_rank 0 builds an empty Markov head in vLLM's Qwen3DSparkModel (not run here)")
        if arch is not None and arch not in VLLM_CHECKED_TARGETS:
            notes.append(
                f"vllm: target architecture {arch!r}: the drafter taps its layers' hidden states, which vLLM must "
                "emit for this architecture (its EAGLE-3 auxiliary states); not checked here"
            )
        return notes

    def dspark_additions(self, cfg: dict[str, Any], state: dict[str, torch.Tensor], drafter: Any) -> None:
        cfg["dflash_config"] = {**(cfg.get("dflash_config") or {}), "mask_token_id": drafter.mask_token_id}
        if embed_scale(drafter) != 1.0:
            state["embed_tokens.weight"] = scaled_embedding(drafter)


@register("server", "sglang")
class SGLang(Server):
    """SGLang (``models/dspark.py``, ``llama_eagle3.py``, PR #25454)."""

    order = 1

    def dspark_rules(self, drafter: Any, head_type: str | None, target: Any = None) -> list[str]:
        if head_type is None:
            raise InteropError(
                "sglang: markov_rank 0 (a DFlash drafter) is refused: SGLang's DSpark model requires markov_rank > 0; "
                "export without --server for a DFlash-method server"
            )
        if drafter.draft_vocab is not None:
            n, v = drafter.draft_vocab.numel(), drafter.geometry.vocab_size
            raise InteropError(
                f"sglang: a reduced draft vocabulary is refused: SGLang DSpark builds markov_w2 as (vocab_size={v}, r) "
                f"and shares the target's full lm_head, ours is ({n}, r); train with the full vocabulary"
            )
        if drafter.conf_head is None:
            raise InteropError(
                "sglang: a drafter without a confidence head is refused: SGLang builds one in every ragged-verify mode "
                "but static, even with enable_confidence_head false, and raises on its missing weights; "
                "train with a confidence head"
            )
        if embed_scale(drafter) != 1.0:
            raise InteropError(
                f"sglang: the target scales its token embeddings by {embed_scale(drafter):.4g} (Gemma) and the "
                "drafter embeds with those scaled rows; SGLang's DSpark model is not checked to load a drafter's own "
                "embed_tokens instead of the target's unscaled table; export --server vllm or deepspec"
            )
        return []

    def eagle3_additions(self, cfg: dict[str, Any], layer_ids: list[int]) -> list[str]:
        ids, note = sglang_aux_ids(layer_ids)
        cfg["eagle_config"] = {**cfg.get("eagle_config", {}), "eagle_aux_hidden_state_layer_ids": ids}
        return [note] if note else []

    def write(self, folder: Path, drafter: Any, target: Any = None, job: ExportJob | None = None) -> list[str]:
        """The STS tables SGLang loads (:func:`sglang_sts_files`) and a note naming the flag that loads them; without
        a calibration, a note naming the command that fits one."""
        if getattr(drafter, "conf_head", None) is None:
            return []  # EAGLE-3 (a DSpark drafter without one is refused): no confidence to calibrate
        docs, notes = sglang_sts_files(drafter)
        if not docs and not notes:
            return [
                "sglang: no STS calibration, so SGLang's scheduler would rank raw confidences; fit one with "
                "dspark-lightning calibrate --drafter DIR --temperature T, then export again"
            ]
        for name, doc in docs.items():
            atomic_write(folder / name, json.dumps(doc, indent=1) + "\n")
        where = (job.out if job else None) or Path("<export>")
        if docs:
            files = ", ".join(f"{where / n} (T = {d['sampling_temperature']:g})" for n, d in docs.items())
            notes.append(
                f"sglang: STS tables for {SGLANG_STS_FLAG} (one per server launch, applied to every request: pass "
                f"the one of the sampling temperature served): {files}"
            )
        return notes


SGLANG_STS_FLAG = "--speculative-dspark-confidence-sts-path"


def sglang_sts_file(sampling_temperature: float) -> str:
    """The name of the SGLang STS table fitted at this sampling temperature."""
    return f"sglang_sts_T{float(sampling_temperature):g}.json"


def sglang_sts_files(drafter: Any) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """{file name: document} of the STS tables SGLang loads, one per calibrated sampling temperature, and notes.

    SGLang (0.5.23, ``srt/speculative/dspark_components/dspark_sts.py``: ``DSparkStsCalibration``,
    ``load_sts_calibration_from_path``) reads a JSON object whose ``temperatures`` holds one positive number per
    draft position, γ of them (``dspark_planner.py`` raises on another length); its other keys are optional, unknown
    ones ignored. ``DSparkConfidenceHead.apply_sts`` (``srt/models/dspark.py``) scores position k with σ(z_k / T_k)
    and the planner ranks their running product: the survival our STS fits (:mod:`dspark_lightning.calibration.sts`).
    SGLang loads one table per server and has no key for the sampling temperature it was fitted at:
    ``sampling_temperature`` (ignored there) says which it is.
    """
    gamma = int(drafter.block_size)
    docs, notes = {}, []
    for T, temps in sorted((getattr(drafter, "calibrations", None) or {}).items()):
        if len(temps) < gamma:
            notes.append(
                f"sglang: the STS calibration at T = {T:g} has {len(temps)} temperatures for block size {gamma}, a "
                "length SGLang refuses: no table written for it (recalibrate)"
            )
            continue
        docs[sglang_sts_file(T)] = {"temperatures": [float(t) for t in temps[:gamma]], "sampling_temperature": T}
    return docs, notes


@register("server", "deepspec")
class DeepSpec(Server):
    """DeepSpec's model code (``modeling/dspark/qwen3/``)."""

    order = 2

    def dspark_rules(self, drafter: Any, head_type: str | None, target: Any = None) -> list[str]:
        if drafter.draft_vocab is not None:
            raise InteropError(
                "deepspec: a reduced draft vocabulary is refused: DeepSpec's Qwen3DSparkModel has a (vocab_size, d) "
                "lm_head and reads no d2t; train with the full vocabulary"
            )
        return []

    def dspark_additions(self, cfg: dict[str, Any], state: dict[str, torch.Tensor], drafter: Any) -> None:
        cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": drafter.geometry.rope_theta}
        state["embed_tokens.weight"] = scaled_embedding(drafter)
        state["lm_head.weight"] = drafter.lm_head.weight.detach().clone()

    def eagle3_rules(self) -> None:
        raise InteropError("deepspec: only --layout dspark-hf (Qwen3DSparkModel) is checked against DeepSpec")


@register("server", "llamacpp")
class LlamaCpp(Server):
    """llama.cpp (b11434: ``conversion/qwen.py`` ``DSparkModel``, ``src/models/dflash.cpp``); its GGUF is its own
    converter's output. Not required in ``all`` folders: they get a GGUF only where its rules pass."""

    order = 3

    in_all = False

    def dspark_rules(self, drafter: Any, head_type: str | None, target: Any = None) -> list[str]:
        if head_type is None:
            raise InteropError(
                "llamacpp: markov_rank 0 (a DFlash drafter) is refused: --spec-type draft-dspark asserts the Markov "
                "weights, and llama.cpp's draft-dflash path (block_size - 1 drafts) is not checked against ours; "
                "export --server vllm or deepspec"
            )
        if head_type != "vanilla":
            raise InteropError(
                f"llamacpp: markov_head_type {head_type!r} is refused: llama.cpp's converter and graph know the "
                "vanilla Markov head only; train seq_head vanilla or export with --server sglang"
            )
        if target is not None:
            from .llamacpp import check_target_arch

            check_target_arch(target_arch(target))
        return []

    def write(self, folder: Path, drafter: Any, target: Any = None, job: ExportJob | None = None) -> list[str]:
        """``draft.gguf`` (and with ``job.target_gguf`` ``target.gguf``): llama.cpp's converter on the generic
        layout in the export's precision."""
        from .llamacpp import write_gguf

        return write_gguf(folder, drafter, target, job or ExportJob())

    def eagle3_rules(self) -> None:
        raise InteropError("llamacpp: only --layout dspark-hf is converted for llama.cpp here (draft-dspark)")


# Target architectures whose vLLM model emits the auxiliary hidden states a DSpark drafter taps (``SupportsEagle3`` in
# copies of vllm/model_executor/models/{llama,qwen3}.py in the index); for the others the export says it is unchecked.
VLLM_CHECKED_TARGETS = ("LlamaForCausalLM", "Qwen3ForCausalLM")
VLLM_VERSION = "0.32.0"  # the vLLM that tests/slow/test_vllm.py runs (export/vllm.py pins it)
# Target architectures vLLM was run with here and refused a DSpark drafter on: the file of the model class that lacks
# the auxiliary hidden states (tests/slow/test_vllm.py runs it again).
VLLM_NO_AUX_STATES = {"Gemma3ForCausalLM": "vllm/model_executor/models/gemma3.py Gemma3ForCausalLM"}


def target_arch(target: Any) -> str | None:
    """The target's HF architecture name (a model built from a config names none: its class is the name)."""
    if target is None:
        return None
    model = target.model
    return (getattr(model.config, "architectures", None) or [type(model).__name__])[0]


def dspark_additions(cfg: dict[str, Any], state: dict[str, torch.Tensor], drafter: Any, server: str | None) -> None:
    """Write, in place, the config keys and tensors the server (every one for ``all``) reads beyond the generic
    layout."""
    for s in wanted(server):
        s.dspark_additions(cfg, state, drafter)


# --- eagle3-hf --------------------------------------------------------------------------------------------------
def sglang_aux_ids(layer_ids: list[int]) -> tuple[list[int], str | None]:
    """``eagle_config.eagle_aux_hidden_state_layer_ids`` for SGLang, and a note naming the versions it suits.

    SGLang captures the *input* of layer c (the output of layer c-1). Before PR #25454 it sets c = id + 1 for every
    id; since then only when the first id is 1 (else c = id). Our id t is the output of layer t, so c = t + 1.
    """
    if layer_ids[0] == 1:
        return list(layer_ids), None  # +1 under both rules
    if layer_ids[0] == 0:
        raise InteropError(
            f"sglang: EAGLE-3 tapping layer 0 first is refused: since {SGLANG_PR} ids starting at 1 get +1 and "
            "others are used as is, so the output of layer 0 cannot be named; retrain tapping layers >= 1"
        )
    note = f"sglang: aux ids follow {SGLANG_PR} and later; older SGLang adds +1 and taps one layer late"
    return [t + 1 for t in layer_ids], note


def refuse_eagle3(server: str | None) -> None:
    if server is not None and server != ALL:
        server_for(server).eagle3_rules()


def eagle3_additions(cfg: dict[str, Any], layer_ids: list[int], server: str | None) -> list[str]:
    """SGLang reads ``eagle_config``; vLLM the top-level ids (already in its convention). Returns notes."""
    notes: list[str] = []
    for s in wanted(server):
        notes += s.eagle3_additions(cfg, layer_ids)
    return notes
