"""The recipe's ``target``, ``model.loss`` and ``model.optim`` sections, and the checks that refuse hyperparameters
which can only train NaN weights (or nothing), before the target is loaded."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import torch
from jsonargparse.typing import register_type

from ..checks import UsageError
from ..devices import resolve_dtype
from ..registry import Component
from ..targets import ChatFormat, Target, load_target
from .schedule import SCHEDULES, Phase

# a component a recipe names inside a section (data.regen.backend, export.layout) reaches its owner whole, for
# registry.build and the component's own constructor
register_type(Component, serializer=lambda c: c.spec, deserializer=Component)

# Precisions that run the drafter's weights in one dtype (no autocast): the shared target parts must match it.
TRUE_PRECISIONS = {
    "64-true": torch.float64,
    "32-true": torch.float32,
    "16-true": torch.float16,
    "bf16-true": torch.bfloat16,
}


C = TypeVar("C")


def as_config(value: Any, cls: type[C], name: str) -> C:
    """An option section given from Python or YAML: None (the defaults), an instance of ``cls``, or a dict of its
    fields (an unknown key is named with the keys that exist)."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, dict):
        fields = [f.name for f in dataclasses.fields(cls)]
        unknown = [k for k in value if k not in fields]
        if unknown:
            raise UsageError(f"{name}: unknown key(s) {unknown}; the keys are {fields}")
        return cls(**value)
    raise TypeError(f"{name} must be a {cls.__name__} or a dict of its fields, got {type(value).__name__}")


@dataclass
class TargetConfig:
    """The frozen target a recipe trains against: its ``target:`` section, declared once and read by both the model and
    the data (``dspark-lightning fit`` links it to ``model.target`` and ``data.target``; from Python, pass the same
    object, or the name alone, to :class:`~.module.DSparkModule` and :class:`~.datamodule.DSparkDataModule`)."""

    name: str
    """embedded target name (``smollm2-135m-instruct``, ``gemma3-270m``, ``tiny-debug``) or an HF model directory"""
    layer_ids: list[int] | None = None
    """tapped target layers (null = the docs/algorithm.md §3.2 rule)"""
    system_prompt: str | None = None
    """system prompt of the chat format every stage shares (null = the template's default)"""
    chat_template: str | None = None
    """a Jinja chat template for a target without one (a base model; null = the tokenizer's own, else raw text)"""
    dtype: str | None = None
    """the target's dtype for regeneration, features and training (null = fp32 for a CPU or 32-bit-precision fit,
    else bf16 on a machine with CUDA, fp32 on one without: :func:`target_for_trainer`). Under a ``*-true`` precision
    it must be that precision's dtype, since the drafter shares the target's embedding and LM head"""

    def chat(self) -> ChatFormat:
        return ChatFormat(system_prompt=self.system_prompt, template=self.chat_template)

    def torch_dtype(self) -> torch.dtype:
        """The dtype the model trains against and the data is made with: this section's, null resolved for the
        machine (bf16 where CUDA is available, else fp32), never for the device a stage happens to run on, so
        ``prepare --device cpu`` on a GPU machine makes the data that ``fit`` there looks for."""
        return resolve_dtype(self.dtype, "auto")

    def load(self, device: str | torch.device | None = None, dtype: str | None = None) -> Target:
        """The target (memoised by :func:`~dspark_lightning.targets.load_target`) on ``device`` (default the CPU) in
        ``dtype`` (default :meth:`torch_dtype`)."""
        dtype = resolve_dtype(dtype, "auto") if dtype is not None else self.torch_dtype()
        return load_target(self.name, layer_ids=self.layer_ids, chat=self.chat(), dtype=dtype, device=device or "cpu")


def target_config(value: TargetConfig | str | dict) -> TargetConfig:
    """A recipe's or a caller's target: the section, its name alone, or a dict of its fields."""
    return TargetConfig(name=value) if isinstance(value, str) else as_config(value, TargetConfig, "target")


def _runs_on_cpu(accelerator: Any) -> bool:
    """Whether ``trainer.accelerator`` (a name, an Accelerator, or its ``class_path`` section) is the CPU."""
    if isinstance(accelerator, str):
        return accelerator.lower() == "cpu"
    path = accelerator.get("class_path") if isinstance(accelerator, dict) else getattr(accelerator, "class_path", None)
    return str(path or type(accelerator).__name__).rsplit(".", 1)[-1] == "CPUAccelerator"


def target_for_trainer(target: Any, accelerator: Any = None, precision: Any = None) -> dict[str, Any]:
    """The recipe's ``target:`` section as the model and the data receive it, in ``fit`` and in ``prepare`` alike
    (both link ``target``, ``trainer.accelerator`` and ``trainer.precision`` through this function, so the data
    ``prepare`` makes is the data ``fit`` looks for): name, tapped layers and chat settings as written; ``dtype:
    null`` follows the trainer, fp32 for a CPU run or a 32/64-bit precision (the CPU recipes stay fp32 on a machine
    that has a GPU), else null, which :meth:`TargetConfig.torch_dtype` resolves for the machine (bf16 on CUDA)."""
    if not isinstance(target, TargetConfig | str | dict) and hasattr(target, "__dict__"):  # a jsonargparse Namespace
        target = dict(vars(target))
    cfg = target_config(target)
    if cfg.dtype is None and (
        _runs_on_cpu(accelerator or "auto") or str(precision or "32-true").startswith(("32", "64"))
    ):
        cfg = dataclasses.replace(cfg, dtype="fp32")
    return dataclasses.asdict(cfg)


@dataclass
class LossConfig:
    """Loss weights (docs/algorithm.md §4): L = ce_weight·CE + l1_weight·L1 + conf_weight·BCE."""

    ce_weight: float = 0.1
    """weight of the cross-entropy to the data token"""
    l1_weight: float = 0.9
    """weight of the full L1 distance to the target distribution"""
    conf_weight: float = 1.0
    """weight of the confidence BCE against the detached acceptance label"""
    conf_label: Literal["analytic", "greedy"] = "analytic"
    """the confidence head's label: analytic, Σ min(p_d, p_t) (the acceptance probability at T = 1, the paper's);
    greedy, 1[argmax p_d = argmax p_t] (the event of T = 0 serving)"""
    soft_ce_weight: float = 0.0
    """weight of the soft cross-entropy to the target distribution (EAGLE-3's loss)"""
    top_ce_weight: float = 0.0
    """weight of a cross-entropy to the target's argmax token (the T = 0 label, free from the target logits)"""
    draft_vocab_space: bool = True
    """with a reduced draft vocabulary, compute the loss over its N tokens only: the target logits of those rows,
    with the full-vocabulary log-sum-exp and argmax cached at feature extraction (or computed once per step
    without a cache), so the mass outside still counts as rejected; equal values and gradients (tested)"""
    decay: float | None = 4.0
    """position weights w_k = exp(-(k-1)/decay); null = uniform"""
    chunk_size: int | None = None
    """anchor blocks per chunk of the per-token loss (activation-checkpointed): bounds the fp32 (rows x V) tensors
    to chunk_size·γ rows (docs/training.md); null = all at once (the CPU recipes: each chunk's terms and target
    logits are computed twice, and their tensors are small there). Set it for large vocabularies on GPUs
    (recipes/gpu/: 32). Changes no value."""


@dataclass
class OptimConfig:
    """AdamW with linear warmup then cosine decay to 0 (docs/algorithm.md §4)."""

    lr: float = 6e-4
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    warmup_fraction: float = 0.04
    """fraction of the total optimizer steps spent in linear warmup"""
    schedule: str = "cosine"
    """after warmup: cosine (to 0), wsd (constant, then linear to 0 over decay_fraction) or constant"""
    decay_fraction: float = 0.2
    """wsd: share of training spent in the final linear decay"""
    fused: bool | None = None
    """AdamW's fused kernel (one pass per parameter instead of a dozen foreach passes): null = on where torch has it
    for the parameters (CPU and CUDA tensors, not FSDP2's DTensors) and the precision is not ``*-mixed`` (Lightning's
    AMP plugin cannot clip a fused optimizer's gradients); on a CPU it speeds up the optimizer step of a large
    table, but not a whole training step (benchmarks/results/matrix.md, "Fused AdamW")"""
    time_budget_s: float | None = None
    """schedule progress by wall-clock time as well: max(step / max_steps, elapsed / time_budget_s) (a fixed-time
    run, e.g. the experiment matrix; pair it with trainer.max_time)"""


def _require(ok: bool, name: str, value: object, rule: str) -> None:
    if not ok:
        raise UsageError(f"{name} must be {rule}, got {value}")


def _finite(v: object) -> bool:
    return isinstance(v, int | float) and math.isfinite(v)


def check_hparams(loss: LossConfig, optim: OptimConfig, block_size: int) -> None:
    """Refuse hyperparameters that can only train NaN weights (a non-finite or non-positive lr, a NaN loss weight,
    ``decay: 0``) or nothing at all, before the target is loaded; the message names the recipe key."""
    _require(isinstance(block_size, int) and block_size >= 1, "model.block_size", block_size, "an integer >= 1")
    weights = {
        k: getattr(loss, k) for k in ("ce_weight", "l1_weight", "conf_weight", "soft_ce_weight", "top_ce_weight")
    }
    for k, v in weights.items():
        _require(_finite(v) and v >= 0, f"model.loss.{k}", v, "finite and >= 0")
    _require(sum(weights.values()) > 0, "one of model.loss.*_weight", 0, "> 0 (an all-zero loss trains nothing)")
    decay_ok = loss.decay is None or (_finite(loss.decay) and loss.decay > 0)
    _require(decay_ok, "model.loss.decay", loss.decay, "finite and > 0 (null = uniform position weights)")
    _require(loss.chunk_size is None or loss.chunk_size >= 1, "model.loss.chunk_size", loss.chunk_size, ">= 1 or null")
    o = optim
    _require(_finite(o.lr) and o.lr > 0, "model.optim.lr", o.lr, "finite and > 0")
    _require(_finite(o.eps) and o.eps > 0, "model.optim.eps", o.eps, "finite and > 0")
    betas_ok = len(o.betas) == 2 and all(_finite(b) and 0 <= b < 1 for b in o.betas)
    _require(betas_ok, "model.optim.betas", tuple(o.betas), "two numbers in [0, 1)")
    _require(_finite(o.weight_decay) and o.weight_decay >= 0, "model.optim.weight_decay", o.weight_decay, ">= 0")
    _require(_finite(o.warmup_fraction) and 0 <= o.warmup_fraction <= 1, "model.optim.warmup_fraction",
             o.warmup_fraction, "in [0, 1]")  # fmt: skip
    _require(o.schedule in SCHEDULES, "model.optim.schedule", o.schedule, f"one of {', '.join(SCHEDULES)}")
    _require(_finite(o.decay_fraction) and 0 < o.decay_fraction <= 1, "model.optim.decay_fraction",
             o.decay_fraction, "in (0, 1]")  # fmt: skip
    budget_ok = o.time_budget_s is None or (_finite(o.time_budget_s) and o.time_budget_s > 0)
    _require(budget_ok, "model.optim.time_budget_s", o.time_budget_s, "> 0 seconds or null")
    _require(_finite(loss.top_ce_weight) and loss.top_ce_weight >= 0, "model.loss.top_ce_weight",
             loss.top_ce_weight, "finite and >= 0")  # fmt: skip


def check_precision(precision: str, target_dtype: torch.dtype) -> None:
    """A ``*-true`` precision casts the drafter's weights, not the target's (not a sub-module), yet the drafter
    computes with the target's embedding: their dtypes must agree (mixed precision autocasts and takes any)."""
    want = TRUE_PRECISIONS.get(precision)
    if want is not None and want != target_dtype:
        raise UsageError(
            f"trainer.precision {precision} runs the drafter in {want} but the target (whose embedding and LM "
            f"head the drafter shares) is {target_dtype}: set target.dtype to match, or use a *-mixed precision"
        )


def check_phase_anchors(curriculum: list[Phase], max_anchors: int | None) -> None:
    """A phase can only keep fewer anchors than the loader samples (``data.max_anchors``)."""
    for i, ph in enumerate(curriculum):
        if max_anchors is not None and ph.anchors is not None and ph.anchors > max_anchors:
            raise UsageError(
                f"model.curriculum[{i}].anchors is {ph.anchors} but data.max_anchors samples only {max_anchors} per "
                "sequence: raise data.max_anchors to the largest phase's anchors"
            )
