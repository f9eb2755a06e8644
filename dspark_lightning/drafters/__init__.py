"""Drafters composed from registered parts, and the registered drafters: ``dspark``, ``dflash`` (parallel
backbones, :class:`Drafter`) and the autoregressive baselines ``eagle3``, ``mtp1`` (:class:`ChainDrafter`).

Python composes by name::

    from dspark_lightning import create, load_target
    target = load_target("tiny-debug")
    drafter = create("drafter", "dspark", target, block_size=7,
                     backbone={"class_path": "dense", "init_args": {"num_layers": 2}}, seq_head="rnn")

Everything that assembles a drafter (the registered ``dspark`` / ``dflash``, a recipe's ``model:`` section in
``DSparkModule``, an export's config.json in ``load_drafter``) goes through :func:`build_drafter`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from torch import nn

from ..checks import UsageError
from ..registry import build, register
from .backbones import DenseBackbone, MoESWABackbone
from .chain import ChainDrafter, ChainLayer
from .drafter import CONVENTION, Drafter, DraftOutput
from .heads import ConfidenceHead, GatedMarkovHead, RNNHead, SeqHead, VanillaMarkovHead

__all__ = [
    "CONVENTION",
    "ChainDrafter",
    "ChainLayer",
    "ConfidenceHead",
    "DenseBackbone",
    "DraftOutput",
    "Drafter",
    "GatedMarkovHead",
    "MoESWABackbone",
    "RNNHead",
    "SeqHead",
    "VanillaMarkovHead",
    "assemble",
    "build_drafter",
    "build_part",
    "compose",
    "draft_geometry",
]

Spec = str | dict[str, Any] | Callable[..., nn.Module] | None


def build_part(kind: str, spec: Spec, *args: Any) -> nn.Module | None:
    """Instantiate a part from its one spelling (:func:`~dspark_lightning.registry.build`: a registered name or
    ``{"class_path": ..., "init_args": {...}}``) with the caller's ``args`` (the geometry), or call a builder with
    ``args`` (what jsonargparse makes of a recipe's ``class_path`` + ``init_args``)."""
    if spec is None:
        return None
    if callable(spec):
        return spec(*args)
    return build(kind, spec, *args)


def compose(
    target: Any,
    backbone: nn.Module,
    seq_head: nn.Module | None,
    conf_head: nn.Module | None,
    block_size: int,
    mask_token_id: int | None = None,
    draft_vocab_size: int | None = None,
) -> Drafter:
    """Wire parts to a target: shared frozen embedding / LM head, geometry, mask token, draft vocabulary size."""
    from ..targets import default_mask_token_id

    return Drafter(
        backbone,
        seq_head,
        conf_head,
        geometry=draft_geometry(target, draft_vocab_size),
        embed=target.embed_tokens,
        lm_head=target.lm_head,
        block_size=block_size,
        mask_token_id=default_mask_token_id(target) if mask_token_id is None else mask_token_id,
    )


def draft_geometry(target: Any, draft_vocab_size: int | None):
    """The geometry a drafter's parts are built with: the target's, plus the draft vocabulary size."""
    return replace(target.geometry, draft_vocab_size=draft_vocab_size)


def assemble(target: Any, block_size: int, backbone: Spec, seq_head: Spec = None, conf_head: Spec = None,
             mask_token_id: int | None = None, draft_vocab_size: int | None = None) -> Drafter:  # fmt: skip
    """A parallel-backbone drafter from its parts: each built from the draft geometry (the confidence head also from
    the sequential head's token width), then wired to the target by :func:`compose`. The heads are built before the
    backbone (the order of the random initialisation, as recipes have always trained)."""
    g = draft_geometry(target, draft_vocab_size)
    sh = build_part("seq_head", seq_head, g)
    ch = build_part("conf_head", conf_head, g, getattr(sh, "token_dim", 0))
    bb = build_part("backbone", backbone, g)
    return compose(target, bb, sh, ch, block_size, mask_token_id, draft_vocab_size)


def build_drafter(
    target: Any,
    block_size: int,
    *,
    drafter: str | dict[str, Any] | None = None,
    backbone: Spec = None,
    seq_head: Spec = None,
    conf_head: Spec = None,
    mask_token_id: int | None = None,
    draft_vocab_size: int | None = None,
) -> nn.Module:
    """The one way to assemble a drafter: a registered drafter whole (``drafter``: a name such as ``eagle3``, or
    ``{class_path: NAME, init_args: {...}}``, given ``block_size`` and ``draft_vocab_size``), or :func:`assemble` of
    parts."""
    if drafter is not None:
        if backbone is not None or seq_head is not None or conf_head is not None:
            raise UsageError("give either model.drafter or model.backbone/seq_head/conf_head, not both")
        spec = {"class_path": drafter} if isinstance(drafter, str) else dict(drafter)
        init = spec.get("init_args") or {}
        if isinstance(init, dict):  # anything else: build() names it
            vocab = {} if draft_vocab_size is None else {"draft_vocab_size": draft_vocab_size}
            init = {**init, "block_size": block_size, **vocab}
        return build("drafter", {**spec, "init_args": init}, target)
    if backbone is None:
        raise UsageError("model.backbone is required (or name a registered model.drafter)")
    return assemble(target, block_size, backbone, seq_head, conf_head, mask_token_id, draft_vocab_size)


@register("drafter", "dspark")
def dspark(
    target: Any,
    block_size: int = 7,
    backbone: Spec = "dense",
    seq_head: Spec = "vanilla",
    conf_head: Spec = "linear",
    mask_token_id: int | None = None,
    draft_vocab_size: int | None = None,
) -> Drafter:
    """DSpark: parallel backbone + sequential head + confidence head (optionally over a reduced draft vocabulary)."""
    return assemble(target, block_size, backbone, seq_head, conf_head, mask_token_id, draft_vocab_size)


@register("drafter", "dflash")
def dflash(
    target: Any,
    block_size: int = 7,
    backbone: Spec = "dense",
    mask_token_id: int | None = None,
    draft_vocab_size: int | None = None,
) -> Drafter:
    """DFlash baseline: the same backbone, no sequential head, no confidence head."""
    return assemble(target, block_size, backbone, None, None, mask_token_id, draft_vocab_size)
