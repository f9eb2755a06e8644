"""Evaluation helpers: held-out prompt sets by domain and reference decoders. Never imports lightning."""

from .hf import hf_generate
from .prompts import EVAL_SETS, eval_prompts

__all__ = ["EVAL_SETS", "eval_prompts", "hf_generate"]
