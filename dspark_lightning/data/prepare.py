"""The data stages before training: prompts -> regenerated responses -> tokenised rows -> (cached) features.

Lightning-free; the DataModule calls :func:`prepare` from ``prepare_data`` and :func:`open_split` from
``setup``. Every stage is resumable or reusable: responses are keyed by id, an existing feature cache is
validated and reused (never overwritten), and per-stage wall times / throughputs go to ``prepare_stats.json``.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .cache import FeatureCache, cache_meta, describe_estimate, write_cache
from .features import extract_features, tokenize_conversations
from .regenerate import load_conversations, regenerate
from .sources import mixture

log = logging.getLogger(__name__)
SPLITS = ("train", "heldout")


@dataclass
class RegenConfig:
    """Response regeneration by the target (sampling settings recommended for the target)."""

    batch_size: int = 8
    max_new_tokens: int = 256
    temperature: float = 0.2
    top_p: float = 0.9
    top_k: int | None = None
    max_turns: int | None = None
    """answer at most this many user turns per conversation (null = all)"""
    engine: str = "dspark"
    """dspark: our decoding engine with continuous batching over conversations; hf: HF generate in batches"""
    concurrency: int = 32
    """turns decoding together with the dspark engine (batch_size is the HF engine's batch)"""


@dataclass
class DataPaths:
    root: Path

    def responses(self, split: str) -> Path:
        return self.root / f"responses_{split}.jsonl"

    def cache(self, split: str) -> Path:
        return self.root / f"features_{split}"

    @property
    def stats(self) -> Path:
        return self.root / "prepare_stats.json"


def _log(msg: str) -> None:
    print(f"[dspark-lightning] {msg}", flush=True)


def prompts_by_split(sources: list[Any], heldout_fraction: float, split_seed: int) -> dict[str, list]:
    return {s: mixture(sources, s, heldout_fraction, split_seed) for s in SPLITS}


def tokenized_split(target: Any, paths: DataPaths, split: str, ids: set[str], max_length: int, min_sup: int) -> list:
    rows = [r for r in load_conversations(paths.responses(split)) if r["id"] in ids]
    if not rows:
        raise ValueError(f"{paths.responses(split)} has no conversations for the configured {split} prompts")
    return tokenize_conversations(target, rows, max_length, min_sup)


def check_caches(target: Any, paths: DataPaths, feature_dtype: str) -> None:
    """Validate existing caches up front (cheap checks first), so a bad shard fails before any expensive work."""
    for split in SPLITS:
        if paths.cache(split).exists():
            FeatureCache(paths.cache(split), expect=_expect(target, feature_dtype))


def _expect(target: Any, feature_dtype: str) -> dict[str, Any]:
    meta = cache_meta(target, feature_dtype)
    return {k: meta[k] for k in ("target", "layer_ids", "hidden_size", "feature_dtype", "chat")}


def prepare(
    target: Any,
    sources: list[Any],
    work_dir: str | Path,
    *,
    heldout_fraction: float = 0.05,
    split_seed: int = 42,
    regen: RegenConfig | None = None,
    max_length: int = 1024,
    min_supervised: int = 14,
    features: str = "cached",
    feature_dtype: str = "bfloat16",
    seed: int = 42,
) -> dict[str, Any]:
    """Run every data stage that is not done yet; returns (and writes) per-stage statistics."""
    regen = regen or RegenConfig()
    paths = DataPaths(Path(work_dir))
    paths.root.mkdir(parents=True, exist_ok=True)
    if features == "cached":
        check_caches(target, paths, feature_dtype)
    stats: dict[str, Any] = {"target": target.name, "features": features}
    prompts = prompts_by_split(sources, heldout_fraction, split_seed)
    for split in SPLITS:
        _log(f"{split} responses ({len(prompts[split])} prompts, {target.name}) -> {paths.responses(split)}")
        t0 = time.perf_counter()
        st = regenerate(target, prompts[split], paths.responses(split), seed=seed, **asdict(regen))
        if st["written"]:  # a fully resumed stage keeps the statistics of the run that did the work
            stats[f"regenerate_{split}"] = {**st, "wall_s": time.perf_counter() - t0}
        _log(f"  {st['written']} regenerated, {st['skipped']} reused from the file")
    if features == "cached":
        for split in SPLITS:
            out = paths.cache(split)
            if out.exists():
                _log(f"reusing feature cache {out}")
                continue
            ids = {p.id for p in prompts[split]}
            rows = tokenized_split(target, paths, split, ids, max_length, min_supervised)
            ntok = sum(len(r["input_ids"]) for r in rows)
            _log(f"feature cache {out}: " + describe_estimate(ntok, target, feature_dtype, len(rows)))
            t0 = time.perf_counter()
            stream = extract_features(target, rows, feature_dtype=feature_dtype)
            write_cache(stream, out, cache_meta(target, feature_dtype, split=split))
            stats[f"features_{split}"] = {
                "tokens": stream.stats.tokens,
                "samples": len(rows),
                "wall_s": time.perf_counter() - t0,
                "tokens_per_s": stream.stats.tokens_per_second,
                "cache_bytes": sum(f.stat().st_size for f in out.iterdir()),
            }
    old = json.loads(paths.stats.read_text()) if paths.stats.exists() else {}
    paths.stats.write_text(json.dumps({**old, **stats}, indent=2) + "\n")
    return stats


def open_split(
    target: Any,
    sources: list[Any],
    work_dir: str | Path,
    split: str,
    *,
    heldout_fraction: float,
    split_seed: int,
    max_length: int,
    min_supervised: int,
    features: str,
    feature_dtype: str,
):
    """The dataset of one split: a :class:`FeatureCache` (cached) or a list of tokenised rows (online)."""
    paths = DataPaths(Path(work_dir))
    if features == "cached":
        return FeatureCache(paths.cache(split), expect=_expect(target, feature_dtype))
    ids = {p.id for p in mixture(sources, split, heldout_fraction, split_seed)}
    return tokenized_split(target, paths, split, ids, max_length, min_supervised)
