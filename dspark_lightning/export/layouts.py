"""The serving layouts (registry kind ``layout``): how a drafter's files are laid out for the servers that load them,
written by ``export`` and, where :func:`~dspark_lightning.checkpoint.load_drafter` should read one back, read.

A layout is a class registered with ``@register("layout", "name")`` (a plugin adds one without editing the package):

- ``check(drafter, trained) -> notes``: refuse (:class:`~.common.InteropError`, one line) a drafter whose math the
  layout cannot express; ``export`` runs it first, then the server's rules for the layout (:func:`vet`);
- its own settings are its constructor's typed arguments (``dspark-hf``: ``num_anchors``, ``with_target_vocab``),
  named as every component is: ``--layout dspark-hf`` or ``--layout '{class_path: dspark-hf, init_args: {...}}'``;
- ``build(drafter, target, *, dtype, server) -> (config, state, extra, notes)``: the config.json, the tensors, extra
  files (name -> JSON-able) and notes, with ``server``'s additions for this layout written in
  (:func:`~.servers.add_for`); ``export --layout ...`` writes them (convert.py), then each server's own files;
- ``server_rules``: server name -> :class:`~.servers.Rules`, the rules it brings for servers that have none of their
  own for it (a plugin layout served by a built-in server); a server with neither refuses the layout;
- ``claims(cfg) -> bool`` and ``read(path, cfg, target) -> Drafter``: a directory whose config.json names an HF
  architecture instead of our ``format_version`` is read by the first layout that claims it.

``native`` (our own layout, with its calibration files) is not one of them: ``export --layout native`` re-saves it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..checkpoint.files import weights_sha256
from ..checks import at_least
from ..registry import Component, build, get, name_of, names, register
from .common import CALIBRATION_FILE, DEFAULT_NUM_ANCHORS, InteropError, cast_state
from .dspark_hf import (
    KEEP_FP32,
    calibration_doc,
    check_dspark,
    dspark_config,
    dspark_state,
    is_dspark_config,
    load_dspark_hf,
)
from .dspark_hf import LAYOUT as DSPARK_HF
from .eagle3_hf import LAYOUT as EAGLE3_HF
from .eagle3_hf import check_eagle3, eagle3_config, eagle3_state
from .servers import Rules, add_for, apply_rules

Built = tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, Any], list[str]]


class Layout:
    """A serving layout; a subclass overrides :meth:`build` (and :meth:`check`), and :meth:`claims` / :meth:`read` if
    it is read back (then ``reads = True``). Its settings are its constructor's keyword arguments."""

    reads = False  # load_drafter asks it to claim directories
    server_rules: dict[str, Rules] = {}  # server name -> the rules it brings for it (a subclass declares its own)

    @staticmethod
    def check(drafter: Any, trained: bool = True) -> list[str]:
        return []

    @staticmethod
    def claims(cfg: dict[str, Any]) -> bool:
        return False

    @staticmethod
    def read(path: str | Path, cfg: dict[str, Any], target: Any):
        raise InteropError(f"{path}: this layout is written, not read back")

    def build(self, drafter: Any, target: Any, *, dtype: torch.dtype, server: str | None) -> Built:
        raise NotImplementedError

    @property
    def name(self) -> str:
        return name_of(self)


def serving_layouts() -> list[str]:
    """The registered layouts ``export --layout`` writes (beside ``native``)."""
    return names("layout")


def as_layout(spec: Any) -> Layout:
    """The serving layout ``spec`` names (a registered name or ``{class_path, init_args}``, or YAML text of either),
    built with its settings."""
    spec = Component.unwrap(Component(spec)) if isinstance(spec, str) else spec
    if spec == "native":
        raise InteropError("native is not a serving layout")
    if isinstance(spec, str) and spec not in names("layout"):
        raise InteropError(f"unknown layout {spec!r}; choose from {', '.join(['native', *serving_layouts()])}")
    layout = spec if isinstance(spec, Layout) else build("layout", spec)
    if not isinstance(layout, Layout):
        raise InteropError(f"layout {spec!r} is not an export.Layout")
    return layout


def vet(layout: str, drafter: Any, target: Any, server: str | None, trained: bool = True) -> list[str]:
    """What an export of ``drafter`` in ``layout`` for ``server`` must pass, in this order: the layout's own check,
    then the server's rules for the layout (each ``in_all`` one's for ``all``). Notes, or the first refusal."""
    notes = get("layout", layout).check(drafter, trained)
    return notes + apply_rules(layout, drafter, target, server)


@register("layout", DSPARK_HF)
class DSparkHFLayout(Layout):
    """DeepSpec's ``Qwen3DSparkModel`` (what vLLM, SGLang and DeepSpec load; llama.cpp converts it), sharded or not;
    per-position STS temperatures go to a side file, as no server config has a key for them."""

    reads = True
    check = staticmethod(check_dspark)

    def __init__(self, num_anchors: int | None = None, with_target_vocab: bool = False) -> None:
        """``num_anchors``: written to config.json (training anchors per sequence, informational; null = the value
        the exported drafter records, else 512); ``with_target_vocab``: also write copies of the target's
        ``embed_tokens`` / ``lm_head`` (for server builds that insist on the drafter's own)."""
        if num_anchors is not None:
            at_least("layout dspark-hf: num_anchors", num_anchors, 1)
        self.num_anchors, self.with_target_vocab = num_anchors, with_target_vocab

    @staticmethod
    def claims(cfg: dict[str, Any]) -> bool:
        return is_dspark_config(cfg)

    @staticmethod
    def read(path: str | Path, cfg: dict[str, Any], target: Any):
        return load_dspark_hf(Path(path), cfg, target)

    def build(self, drafter: Any, target: Any, *, dtype: torch.dtype, server: str | None) -> Built:
        check_dspark(drafter)  # what the layout cannot express is refused here too (its notes come from vet)
        state = dspark_state(drafter, self.with_target_vocab)
        config = dspark_config(drafter, target, dtype, self.num_anchors or DEFAULT_NUM_ANCHORS)
        notes = add_for(DSPARK_HF, config, state, drafter, server)
        state = cast_state(state, dtype, keep_fp32=KEEP_FP32)
        extra = {}
        side = calibration_doc(drafter, weights_sha256(state))
        if side is not None:
            extra[CALIBRATION_FILE] = side
            notes.append(
                f"per-position STS temperatures have no server config key: written to {CALIBRATION_FILE} "
                "(read back by load_drafter; SGLang reads them from a file of its own, which --server sglang writes)"
            )
        return config, state, extra, notes


@register("layout", EAGLE3_HF)
class Eagle3HFLayout(Layout):
    """``LlamaForCausalLMEagle3`` (vLLM's and SGLang's EAGLE-3 loaders)."""

    check = staticmethod(check_eagle3)

    def build(self, drafter: Any, target: Any, *, dtype: torch.dtype, server: str | None) -> Built:
        check_eagle3(drafter)
        state = eagle3_state(drafter)
        config = eagle3_config(drafter, target, dtype)
        notes = add_for(EAGLE3_HF, config, state, drafter, server)
        return config, cast_state(state, dtype), {}, notes
