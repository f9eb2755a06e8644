"""Evaluation and calibration prompts per domain: what `eval` decodes, what `calibrate` fits on, and so what no
training mixture may contain (:mod:`dspark_lightning.data.prompts.curate` checks training prompts against them).

The recipes train on GSM-Symbolic problems generated with another seed (seed 1; older recipes: items 0-79 of seed 42),
HumanEval problems 0-79 and the MT-Bench train split (heldout_fraction 0.1, split seed 42), or (the recipes that
decontaminate) on none of these. The evaluation sets are GSM-Symbolic items 80+ of seed 42 (maths), HumanEval 80+
(code) and MT-Bench's held-out split (chat); the calibration pools start at item 120 and at FastChat's dummy
conversations.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Sequence
from pathlib import Path

from ...checks import UsageError
from .sources import DOMAINS, PromptRecord, _turn_texts, build_source, split_of

EVAL_SETS = {
    "math": {"source": "gsm_symbolic", "skip": 80},
    "code": {"source": "humaneval", "skip": 80},
    "chat": {"source": "mtbench", "heldout_fraction": 0.1},
}
CALIBRATION_PROMPTS = {  # held out from every recipe and from `eval`'s first prompts
    "math": {"source": "gsm_symbolic", "skip": 120},
    "code": {"source": "humaneval", "skip": 120},
    "chat": {"source": "sharegpt", "skip": 0},
}


def _records(spec: dict, n: int) -> list[PromptRecord]:
    if "skip" in spec:
        src = {"class_path": spec["source"], "init_args": {"limit": spec["skip"] + n}}
        return list(itertools.islice(build_source(src), spec["skip"], spec["skip"] + n))
    held = (r for r in build_source(spec["source"]) if split_of(r.id, spec["heldout_fraction"]) == "heldout")
    return list(itertools.islice(held, n))


def _first(sets: dict[str, dict], what: str, domain: str, n: int) -> list[PromptRecord]:
    if domain not in sets:
        raise UsageError(f"unknown domain {domain!r}; choose from {', '.join(sets)}")
    recs = _records(sets[domain], n)
    if len(recs) < n:
        raise UsageError(f"the {domain} {what} has only {len(recs)} prompts, asked for {n}")
    return recs


def eval_prompts(domain: str, n: int) -> list[PromptRecord]:
    """The first ``n`` evaluation prompts of ``domain`` (math, code or chat)."""
    return _first(EVAL_SETS, "evaluation set", domain, n)


def calibration_records(domain: str, n: int) -> list[PromptRecord]:
    """``n`` prompts of ``domain``'s STS calibration pool (disjoint from training and from `eval`'s sets)."""
    return _first(CALIBRATION_PROMPTS, "calibration pool", domain, n)


def held_out_texts(per_domain: int = 200) -> dict[str, list[str]]:
    """Every user turn of the first ``per_domain`` evaluation and calibration prompts of each domain, by set name."""
    out: dict[str, list[str]] = {}
    for kind, sets in (("eval", EVAL_SETS), ("calibration", CALIBRATION_PROMPTS)):
        for dom, spec in sets.items():
            out[f"{kind}:{dom}"] = [t for r in _records(spec, per_domain) for t in r.turns]
    return out


def heldout_prompts(path: str | Path, per_set: int, sets: Sequence[str] = DOMAINS) -> dict[str, list[str]]:
    """``per_set`` first user turns per domain of a recipe's held-out responses (``responses_heldout.jsonl``), in a
    fixed order (sha256 of the record id), so every arm and every rerun decodes the same prompts."""
    by_set: dict[str, list[tuple[bytes, str]]] = {s: [] for s in sets}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                rec = json.loads(line)
                dom = rec.get("domain") or "chat"
                if dom in by_set:
                    key = hashlib.sha256(str(rec.get("id", "")).encode()).digest()
                    by_set[dom].append((key, _turn_texts(rec.get("turns"))[0]))
    out = {s: [text for _, text in sorted(rows)[:per_set]] for s, rows in by_set.items()}
    return {s: ps for s, ps in out.items() if ps}
