"""Evaluation prompts per domain that the default recipe never trains on.

The recipes train on GSM-Symbolic problems generated with another seed (seed 1; older recipes: items 0-79 of seed 42),
HumanEval problems 0-79 and the MT-Bench train split (heldout_fraction 0.1, split seed 42). The evaluation sets are
GSM-Symbolic items 80+ of seed 42 (maths), HumanEval 80+ (code) and MT-Bench's held-out split (chat).
"""

from __future__ import annotations

import itertools

from ..data.sources import PromptRecord, build_source, mixture

EVAL_SETS = {
    "math": {"source": {"name": "gsm_symbolic"}, "skip": 80},
    "code": {"source": {"name": "humaneval"}, "skip": 80},
    "chat": {"source": {"name": "mtbench"}, "heldout_fraction": 0.1},
}


def eval_prompts(domain: str, n: int) -> list[PromptRecord]:
    """The first ``n`` evaluation prompts of ``domain`` (math, code or chat)."""
    if domain not in EVAL_SETS:
        raise ValueError(f"unknown domain {domain!r}; choose from {', '.join(EVAL_SETS)}")
    spec = EVAL_SETS[domain]
    if "skip" in spec:
        src = dict(spec["source"], limit=spec["skip"] + n)
        recs = list(itertools.islice(build_source(src), spec["skip"], spec["skip"] + n))
    else:
        recs = mixture([spec["source"]], split="heldout", heldout_fraction=spec["heldout_fraction"])[:n]
    if len(recs) < n:
        raise ValueError(f"domain {domain!r} has only {len(recs)} evaluation prompts, asked for {n}")
    return recs
