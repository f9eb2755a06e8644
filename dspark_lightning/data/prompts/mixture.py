"""A training mixture: sources in order, through curation (:mod:`dspark_lightning.data.prompts.curate`), split by id
hash."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...checks import UsageError
from .curate import curate
from .sources import SPLITS, PromptRecord, PromptSource, build_source, split_of


@dataclass
class Mixture:
    """Every record a mixture keeps (before the train / held-out split), what curation dropped, source weights."""

    records: list[PromptRecord]
    report: Any  # data.prompts.curate.CurationReport
    weights: dict[str, float]  # record id -> training weight (only ids whose source sets one)


_MIXTURES: dict[str, Mixture] = {}


def _stat(path: Any) -> list[int] | None:
    try:
        st = Path(path).stat()
    except OSError:
        return None
    return [st.st_mtime_ns, st.st_size]


def curated_mixture(
    sources: list[PromptSource | Iterable[PromptRecord] | str | dict[str, Any]],
    curation: Any = None,
    tokenizer: Any = None,
    seed: int = 42,
) -> Mixture:
    """Sources in order through :func:`dspark_lightning.data.prompts.curate.curate` (per-source options,
    decontamination, de-duplication). Raises on an id seen twice. Memoised per process for sources given by name or
    dict."""
    key = None
    if all(isinstance(s, str | dict) for s in sources):
        ident = curation.identity() if curation is not None else None
        tok = getattr(tokenizer, "name_or_path", None) if tokenizer is not None else None
        paths = [(s.get("init_args") or {}).get("path") for s in sources if isinstance(s, dict)]
        files = [_stat(p) for p in paths if isinstance(p, str)]  # an edited file is new
        key = json.dumps([sources, ident, tok, seed, files], sort_keys=True, default=str)
        if key in _MIXTURES:
            return _MIXTURES[key]
    parts, weights_by_part = [], []
    for n, spec in enumerate(sources):
        src = build_source(spec)
        opts = dict(getattr(src, "curation", {}))
        label = getattr(src, "name", None) or f"source {n}"
        label = label if sum(1 for p in parts if p[0] == label) == 0 else f"{label}#{n}"
        parts.append((label, src, opts, getattr(src, "benchmark", None)))
        weights_by_part.append(opts.get("weight"))
    count = None
    if tokenizer is not None:

        def count(text: str) -> int:
            return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    kept, report = curate(parts, curation, count, seed)
    weights: dict[str, float] = {}
    start = 0
    for (label, _, _, _), w in zip(parts, weights_by_part, strict=True):  # kept records are in part order
        n_kept = report.sources[label]["kept"]
        if w is not None:
            weights.update({r.id: float(w) for r in kept[start : start + n_kept]})
        start += n_kept
    out = Mixture(kept, report, weights)
    if key is not None:
        _MIXTURES[key] = out
    return out


def mixture(
    sources: list[PromptSource | Iterable[PromptRecord] | str | dict[str, Any]],
    split: str = "train",
    heldout_fraction: float = 0.05,
    seed: int = 42,
    *,
    curation: Any = None,
    tokenizer: Any = None,
) -> list[PromptRecord]:
    """Concatenate sources in order (through :func:`curated_mixture`) and keep one split (``"train"``,
    ``"heldout"`` or ``"all"``).

    Raises on an id seen twice and on an empty result (docs/algorithm.md §10).
    """
    if split not in SPLITS:
        raise UsageError(f"split must be one of {SPLITS}, got {split!r}")
    if not 0.0 <= heldout_fraction <= 1.0:
        raise UsageError(f"heldout_fraction must be in [0, 1], got {heldout_fraction}")
    recs = curated_mixture(sources, curation, tokenizer, seed).records
    seen: dict[str, str] = {}
    for rec in recs:
        if rec.id in seen:
            raise UsageError(f"prompt id {rec.id!r} occurs twice in the mixture (from source {rec.source!r})")
        seen[rec.id] = rec.source
    out = [r for r in recs if split == "all" or split_of(r.id, heldout_fraction, seed) == split]
    if not out:
        raise UsageError(
            f"the prompt mixture has no {split!r} records (sources={sources!r}, heldout_fraction={heldout_fraction})"
        )
    return out
