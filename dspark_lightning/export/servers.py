"""Per-server exports: what each server reads beyond a layout, and what it would load wrongly. A *server* is any
program that loads an exported drafter to decode with it: vLLM, SGLang, llama.cpp, DeepSpec's model code.

A server's rules are keyed by the registered name of the layout they apply to (:class:`Rules`, in
``Server.rules``, or brought by a layout for a server in ``Layout.server_rules``): ``export --layout L --server S``
writes layout L and applies S's rules for L, and refuses in one line a layout S has no rules for. ``--server all``
applies the rules of every server ``in_all`` that serves L (one directory every server loads, where one exists). The
rules, and the server source each was read from, are tabled in docs/serving.md:

- vLLM (``qwen3_dspark.py``, ``llm_base_proposer.py``): no gated / rnn head weights (its loader raises on
  them); ``dflash_config.mask_token_id`` (older V1 proposers read the mask token only there); ``eagle3-hf`` as is.
- SGLang (``models/dspark.py``, ``llama_eagle3.py``, PR #25454): ``markov_rank > 0``; ``markov_w2`` of
  (vocab_size, r); a confidence head (built in every ragged-verify mode but static); EAGLE-3 aux ids in its
  own convention (the target adds +1: always before PR #25454, since then only when the first id is 1); the STS
  table its ``--speculative-dspark-confidence-sts-path`` loads (``dspark_components/dspark_sts.py``), one file per
  calibrated sampling temperature.
- DeepSpec (``modeling/dspark/qwen3/``): ``dspark-hf`` only; the target's ``embed_tokens`` / ``lm_head`` saved in
  the checkpoint (``from_pretrained`` initialises absent ones at random), the full vocabulary, ``rope_parameters``.
- llama.cpp (b11434: ``conversion/qwen.py`` ``DSparkModel``, ``src/models/dflash.cpp``): ``dspark-hf`` only; a
  vanilla Markov head (its converter raises on others), a Markov head at all (``--spec-type draft-dspark`` asserts
  its weights), a reduced vocabulary as ``d2t``; the GGUF itself is its converter's output (llamacpp.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..atomic import atomic_write
from ..registry import get, names, register
from .common import InteropError, embed_scale, scaled_embedding
from .dspark_hf import LAYOUT as DSPARK_HF
from .dspark_hf import head_type
from .eagle3_hf import LAYOUT as EAGLE3_HF
from .llamacpp import check_target_arch, write_gguf

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


def no_notes(*_: Any) -> list[str]:
    """A rule that accepts everything and adds nothing."""
    return []


@dataclass(frozen=True)
class Rules:
    """What one server does with one layout (``Server.rules[layout]``, or ``Layout.server_rules[server]``).

    - ``check(drafter, target) -> notes``: raise :class:`InteropError` in one line naming the server for what it would
      load wrongly or reject; return notes for what it loads with a caveat (``target`` is None where unknown);
    - ``add(cfg, state, drafter) -> notes``: write, in place, the config keys and tensors the server reads beyond the
      layout's (the layout's ``build`` calls it through :func:`add_for`, before it casts and hashes the tensors).
    """

    check: Callable[[Any, Any], list[str]] = no_notes
    add: Callable[[dict[str, Any], dict[str, torch.Tensor], Any], list[str]] = no_notes


class Server:
    """A program that loads an exported drafter (register one with ``@register("server", name)``).

    - ``rules``: layout name -> :class:`Rules`, the layouts it serves (a layout may also bring rules for it,
      ``Layout.server_rules``); any other layout is refused;
    - :meth:`write`: files of its own it reads beside the layout's (a launch config, llama.cpp's GGUF), written into
      the export folder before it is swapped in;
    - :meth:`check`: the reasons a drafter cannot be served in a layout (empty: it can).
    """

    rules: dict[str, Rules] = {}  # a subclass declares its own dict; nothing mutates it
    in_all = True  # ``--server all`` folders must satisfy this server's rules; if False, they get its files only
    # where its rules pass (a note says why not)
    order = 100  # where its rules run among ``all``'s (the first refusal is the one reported)

    @property
    def name(self) -> str:
        return getattr(type(self), "registry_name", type(self).__name__)

    def layouts(self) -> list[str]:
        """The layouts this server serves: those of its ``rules`` and the registered layouts that bring rules for it."""
        return sorted({*self.rules, *(n for n in names("layout") if self.name in brought_rules(n))})

    def rules_for(self, layout: str) -> Rules:
        """Its rules for ``layout`` (its own, else the ones the layout brings for it); refused in one line if none."""
        found = self.rules.get(layout)
        if found is None:
            found = brought_rules(layout).get(self.name)
        if found is None:
            served = ", ".join(self.layouts()) or "none"
            raise InteropError(f"server {self.name} does not serve layout {layout} (it serves: {served})")
        return found

    def write(self, folder: Path, drafter: Any, target: Any = None, job: ExportJob | None = None) -> list[str]:
        """Write the files this server reads beyond the layout's into ``folder`` (the export being built); return
        notes. It must not replace the layout's own files (``config.json``, the weights, the calibration file)."""
        return []

    def check(self, layout: str, drafter: Any, target: Any = None) -> list[str]:
        """Why ``drafter`` (trained or not) cannot be exported in ``layout`` for this server: empty when it can."""
        try:
            self.rules_for(layout).check(drafter, target)
        except InteropError as exc:
            return [str(exc)]
        return []


def brought_rules(layout: str) -> dict[str, Rules]:
    """The rules the registered layout ``layout`` brings for servers (``server_rules``; none for another name)."""
    return getattr(get("layout", layout), "server_rules", {}) if layout in names("layout") else {}


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


def _in_order() -> list[Server]:
    return sorted(map(server_for, server_names()), key=lambda s: (s.order, s.name))


def wanted(name: str | None, layout: str) -> tuple[Server, ...]:
    """The servers whose rules an export in ``layout`` must pass: ``name``'s (refused if it does not serve
    ``layout``), or for ``all`` those ``in_all`` that serve it (refused if none does)."""
    if name is None:
        return ()
    if name != ALL:
        server = server_for(name)
        server.rules_for(layout)
        return (server,)
    found = tuple(s for s in _in_order() if s.in_all and layout in s.layouts())
    if not found:
        served = ", ".join(sorted({n for s in _in_order() if s.in_all for n in s.layouts()})) or "none"
        raise InteropError(f"server {ALL} does not serve layout {layout} (it serves: {served})")
    return found


def apply_rules(layout: str, drafter: Any, target: Any, server: str | None) -> list[str]:
    """The rules of ``server`` (for ``all``, of each server ``in_all`` that serves ``layout``) for ``layout``: their
    notes, or the first refusal (:class:`InteropError`, one line naming the server)."""
    notes: list[str] = []
    for s in wanted(server, layout):
        notes += s.rules_for(layout).check(drafter, target)
    return notes


def add_for(
    layout: str, cfg: dict[str, Any], state: dict[str, torch.Tensor], drafter: Any, server: str | None
) -> list[str]:
    """Write, in place, the config keys and tensors ``server`` (each of ``all``'s) reads beyond ``layout``; return
    notes. A layout's ``build`` calls it before it casts and hashes its tensors."""
    notes: list[str] = []
    for s in wanted(server, layout):
        notes += s.rules_for(layout).add(cfg, state, drafter)
    return notes


def writers(name: str | None, layout: str, drafter: Any, target: Any = None) -> tuple[list[Server], list[str]]:
    """The servers whose :meth:`Server.write` runs on an export in ``layout``, and notes: ``name``'s, or for ``all``
    those ``in_all`` that serve it plus the others whose rules pass this drafter (a note names each left out and
    why)."""
    if name != ALL:
        return list(wanted(name, layout)), []
    out, notes = list(wanted(ALL, layout)), []
    chosen = {s.name for s in out}
    for s in _in_order():
        if s.name in chosen:
            continue
        why = s.check(layout, drafter, target)
        if why:
            notes.append(f"no {s.name} files in this all-servers folder: {why[0]}")
        else:
            out.append(s)
    return out, notes


def target_arch(target: Any) -> str | None:
    """The target's HF architecture name (a model built from a config names none: its class is the name)."""
    if target is None:
        return None
    model = target.model
    return (getattr(model.config, "architectures", None) or [type(model).__name__])[0]


# --- vLLM ------------------------------------------------------------------------------------------------------
# Target architectures whose vLLM model emits the auxiliary hidden states a DSpark drafter taps (``SupportsEagle3`` in
# copies of vllm/model_executor/models/{llama,qwen3}.py in the index); for the others the export says it is unchecked.
VLLM_CHECKED_TARGETS = ("LlamaForCausalLM", "Qwen3ForCausalLM")
VLLM_VERSION = "0.32.0"  # the vLLM that tests/slow/test_vllm.py runs (export/vllm.py pins it)
# Target architectures vLLM was run with here and refused a DSpark drafter on: the file of the model class that lacks
# the auxiliary hidden states (tests/slow/test_vllm.py runs it again).
VLLM_NO_AUX_STATES = {"Gemma3ForCausalLM": "vllm/model_executor/models/gemma3.py Gemma3ForCausalLM"}


def vllm_dspark(drafter: Any, target: Any = None) -> list[str]:
    head = head_type(drafter.seq_head)
    if head in ("gated", "rnn"):
        raise InteropError(
            f"vllm: markov_head_type {head!r} is refused: vLLM's Qwen3 DSpark loader has no "
            f"markov_head.{'gate_proj' if head == 'gated' else 'joint_proj'} and raises on it; "
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
    if head is None:
        notes.append("vllm: markov_rank 0 builds an empty Markov head in vLLM's Qwen3DSparkModel (not run here)")
    if arch is not None and arch not in VLLM_CHECKED_TARGETS:
        notes.append(
            f"vllm: target architecture {arch!r}: the drafter taps its layers' hidden states, which vLLM must "
            "emit for this architecture (its EAGLE-3 auxiliary states); not checked here"
        )
    return notes


def vllm_dspark_additions(cfg: dict[str, Any], state: dict[str, torch.Tensor], drafter: Any) -> list[str]:
    cfg["dflash_config"] = {**(cfg.get("dflash_config") or {}), "mask_token_id": drafter.mask_token_id}
    if embed_scale(drafter) != 1.0:
        state["embed_tokens.weight"] = scaled_embedding(drafter)
    return []


@register("server", "vllm")
class VLLM(Server):
    """vLLM (``qwen3_dspark.py``, ``llm_base_proposer.py``); its EAGLE-3 loader reads the generic ``eagle3-hf``
    (the top-level aux ids are in its convention)."""

    order = 0
    rules = {DSPARK_HF: Rules(vllm_dspark, vllm_dspark_additions), EAGLE3_HF: Rules()}


# --- SGLang ----------------------------------------------------------------------------------------------------
def sglang_dspark(drafter: Any, target: Any = None) -> list[str]:
    if head_type(drafter.seq_head) is None:
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


def sglang_eagle3(drafter: Any, target: Any = None) -> list[str]:
    _, note = sglang_aux_ids(list(drafter.geometry.layer_ids))
    return [note] if note else []


def sglang_eagle3_additions(cfg: dict[str, Any], state: dict[str, torch.Tensor], drafter: Any) -> list[str]:
    """SGLang reads ``eagle_config``'s ids (vLLM the top-level ones, already in its convention)."""
    ids, _ = sglang_aux_ids(list(drafter.geometry.layer_ids))
    cfg["eagle_config"] = {**cfg.get("eagle_config", {}), "eagle_aux_hidden_state_layer_ids": ids}
    return []


@register("server", "sglang")
class SGLang(Server):
    """SGLang (``models/dspark.py``, ``llama_eagle3.py``, PR #25454)."""

    order = 1
    rules = {DSPARK_HF: Rules(sglang_dspark), EAGLE3_HF: Rules(sglang_eagle3, sglang_eagle3_additions)}

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


# --- DeepSpec --------------------------------------------------------------------------------------------------
def deepspec_dspark(drafter: Any, target: Any = None) -> list[str]:
    if drafter.draft_vocab is not None:
        raise InteropError(
            "deepspec: a reduced draft vocabulary is refused: DeepSpec's Qwen3DSparkModel has a (vocab_size, d) "
            "lm_head and reads no d2t; train with the full vocabulary"
        )
    return []


def deepspec_dspark_additions(cfg: dict[str, Any], state: dict[str, torch.Tensor], drafter: Any) -> list[str]:
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": drafter.geometry.rope_theta}
    state["embed_tokens.weight"] = scaled_embedding(drafter)
    state["lm_head.weight"] = drafter.lm_head.weight.detach().clone()
    return []


@register("server", "deepspec")
class DeepSpec(Server):
    """DeepSpec's model code (``modeling/dspark/qwen3/``: ``Qwen3DSparkModel``, the ``dspark-hf`` layout only)."""

    order = 2
    rules = {DSPARK_HF: Rules(deepspec_dspark, deepspec_dspark_additions)}


# --- llama.cpp -------------------------------------------------------------------------------------------------
def llamacpp_dspark(drafter: Any, target: Any = None) -> list[str]:
    head = head_type(drafter.seq_head)
    if head is None:
        raise InteropError(
            "llamacpp: markov_rank 0 (a DFlash drafter) is refused: --spec-type draft-dspark asserts the Markov "
            "weights, and llama.cpp's draft-dflash path (block_size - 1 drafts) is not checked against ours; "
            "export --server vllm or deepspec"
        )
    if head != "vanilla":
        raise InteropError(
            f"llamacpp: markov_head_type {head!r} is refused: llama.cpp's converter and graph know the "
            "vanilla Markov head only; train seq_head vanilla or export with --server sglang"
        )
    if target is not None:
        check_target_arch(target_arch(target))
    return []


@register("server", "llamacpp")
class LlamaCpp(Server):
    """llama.cpp (b11434: ``conversion/qwen.py`` ``DSparkModel``, ``src/models/dflash.cpp``): ``dspark-hf`` only (its
    ``draft-dspark``); its GGUF is its own converter's output. Not required in ``all`` folders: they get a GGUF only
    where its rules pass."""

    order = 3
    in_all = False
    rules = {DSPARK_HF: Rules(llamacpp_dspark)}

    def write(self, folder: Path, drafter: Any, target: Any = None, job: ExportJob | None = None) -> list[str]:
        """``draft.gguf`` (and with ``job.target_gguf`` ``target.gguf``): llama.cpp's converter on the generic
        layout in the export's precision."""
        return write_gguf(folder, drafter, target, job or ExportJob())
