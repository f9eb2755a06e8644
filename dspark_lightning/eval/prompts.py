"""Evaluation prompts per domain that the recipes never train on (defined in
:mod:`dspark_lightning.data.prompts.evalsets`, where training data is checked against them)."""

from __future__ import annotations

from ..data.prompts.evalsets import EVAL_SETS, eval_prompts

__all__ = ["EVAL_SETS", "eval_prompts"]
