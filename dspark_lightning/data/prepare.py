"""The data stages before training: prompts -> regenerated responses -> tokenised rows -> (cached) features.

Lightning-free. ``dspark-lightning prepare`` (and, on a CPU-only machine, the DataModule's ``prepare_data``) runs a
:class:`PrepareJob`; ``setup`` reads the result with :func:`open_split`. Work is sharded over data-parallel ranks
without shared-file races. Layout of ``work_dir``::

    parts/<fingerprint>-w<W>/rank-<r>/responses_<split>.jsonl   rank r's slice of the prompts (append + resume by id)
    parts/<fingerprint>-w<W>/rank-<r>/features_<split>/         rank r's cache, shards "shard-r<r>-<k>.tar"
    parts/<fingerprint>-w<W>/rank-<r>/done.json                 rank r finished (its statistics)
    responses_<split>.jsonl, features_<split>/                  merged by rank 0 once every rank is done
    prepare_stats.json, prepared.json                           statistics; the final index (written last)

Rank r takes prompts ``r::W`` of each split and writes only below its own ``rank-<r>`` directory; the merge links
the rank shards into one cache and writes the JSONL in prompt order. Every final file is written to a temp name and
renamed, so a killed run leaves either the old file or the new one (its temp files are removed by the next write);
a rerun reuses every finished rank (its ``done.json``) and resumes the unfinished ones. The fingerprint covers
everything that changes the data (target and its dtype, regeneration settings, seeds, the prompts' ids and contents,
lengths, feature dtype), so a changed recipe never reuses stale parts: it prepares again, reusing only the
responses whose prompt is unchanged.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from .. import checks
from ..atomic import atomic_write
from ..checks import UsageError
from .features.cache import FeatureCache, cache_meta, describe_estimate, merge_caches, write_cache
from .features.extract import CapturedFeatureStream, extract_features, tokenize_conversations
from .prompts.curate import needs_tokenizer
from .prompts.mixture import curated_mixture, mixture
from .regen.config import RegenConfig
from .regen.regenerate import generation_settings, load_captured, load_conversations, regenerate, same_settings

log = logging.getLogger(__name__)
SPLITS = ("train", "heldout")


CACHE_FORMAT = 2  # 2: samples carry target_lse / target_top (data.features.cache.LAW_SUMMARY)


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

    @property
    def prepared(self) -> Path:
        """The final index: written last by the merge, so its presence means every output is complete."""
        return self.root / "prepared.json"

    def rank_dir(self, fingerprint: str, rank: int, world_size: int) -> Path:
        return self.root / "parts" / f"{fingerprint}-w{world_size}" / f"rank-{rank:05d}"


def _log(msg: str) -> None:
    print(f"[dspark-lightning] {msg}", flush=True)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _rows(path: Path) -> list[dict]:
    """Rows of a rank's JSONL; none when the file is missing or empty (every response of the slice was dropped)."""
    return load_conversations(path) if path.is_file() and path.stat().st_size else []


def several_answers(prompts: list, k: int) -> list:
    """Each prompt to be answered, then ``k - 1`` copies under ids ``<id>#1 .. <id>#<k-1>``: the answers' sampling
    streams are seeded from the id, so each copy gets its own answer (fixed text is kept once)."""
    if k == 1:
        return prompts
    return [
        q for p in prompts for q in (p, *([] if p.responses else [replace(p, id=f"{p.id}#{j}") for j in range(1, k)]))
    ]


def prompt_of(sample_id: str) -> str:
    """The prompt id of a sample id."""
    return sample_id.split("#")[0]  # the j-th answer of a prompt is <id>#j


def first_prompts(sample_ids: list[str], n: int, seed: int) -> set[str]:
    """The ids of the ``n`` prompts first in a fixed order (sha256 of ``seed`` and the id): nested in ``n``."""
    prompts = sorted({prompt_of(i) for i in sample_ids}, key=lambda p: hashlib.sha256(f"{seed}:{p}".encode()).digest())
    if n > len(prompts):
        raise UsageError(f"data.features.train_samples is {n} but the prepared training split holds {len(prompts)} "
                         "conversations; prepare more prompts (the recipe's sources) or ask for fewer")  # fmt: skip
    return set(prompts[:n])


def tokenized_split(target: Any, paths: DataPaths, split: str, ids: set[str], max_length: int, min_sup: int) -> list:
    rows = [r for r in load_conversations(paths.responses(split)) if r["id"] in ids]
    if not rows:
        raise UsageError(f"{paths.responses(split)} has no conversations for the configured {split} prompts")
    return tokenize_conversations(target, rows, max_length, min_sup)


def check_caches(target: Any, paths: DataPaths, feature_dtype: str) -> None:
    """Validate existing caches up front (sizes and member counts), so a bad shard fails before any expensive work."""
    for split in SPLITS:
        if paths.cache(split).exists():
            FeatureCache(paths.cache(split), expect=expected_meta(target, feature_dtype))


def expected_meta(target: Any, feature_dtype: str) -> dict[str, Any]:
    """The meta keys a cache must share with ``target`` to be read for it (not ``split`` or extra keys)."""
    meta = cache_meta(target, feature_dtype)
    return {k: meta[k] for k in ("target", "layer_ids", "hidden_size", "feature_dtype", "chat")}


def _merge_stats(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-stage statistics over ranks: counts add up, wall time is the slowest rank's, throughputs add up."""
    out: dict[str, Any] = {}
    for stats in ranks:
        for stage, st in stats.items():
            agg = out.setdefault(stage, {})
            for k, v in st.items():
                if isinstance(v, bool) or not isinstance(v, int | float):
                    continue
                agg[k] = max(agg.get(k, 0), v) if k in ("wall_s", "seconds") else agg.get(k, 0) + v
    return out


def _prompts_sha256(prompts: list) -> str:
    """Hash of a split's prompts, contents included: a prompt file edited under the same ids changes it too."""
    rows = [
        [p.id, p.domain, list(p.turns)]
        + ([list(p.responses)] if p.responses else [])
        + ([p.system] if p.system else [])
        for p in prompts
    ]
    return hashlib.sha256(json.dumps(rows, ensure_ascii=False).encode()).hexdigest()


def _same_prompt(row: dict, prompt: Any) -> bool:
    """A regenerated row answers this prompt: its user turns are the prompt's first turns (max_turns may cut)."""
    asked = [m.get("content") for m in row.get("turns", []) if m.get("role") == "user"]
    said = [m.get("content") for m in row.get("turns", []) if m.get("role") == "assistant"]
    fixed_ok = bool(row.get("gen", {}).get("fixed")) == bool(prompt.responses) and (
        not prompt.responses or said == [r.strip() for r in prompt.responses[: len(said)]]
    )  # fixed text: kept only for the same text, and never in place of a regenerated answer (or back)
    system = next((m.get("content") for m in row.get("turns", []) if m.get("role") == "system"), None)
    return bool(asked) and asked == list(prompt.turns[: len(asked)]) and fixed_ok and system == prompt.system


@dataclass
class PrepareJob:
    """Every data stage of a recipe, for one rank at a time (see the module docstring for the layout).

    ``load_target`` is called only when a rank has work left, so reusing finished outputs never loads the target;
    ``target_id`` names the target (name, layer ids, chat settings) for the fingerprint without loading it.
    """

    load_target: Callable[[], Any]
    target_id: dict[str, Any]
    sources: list[Any]
    work_dir: str | Path
    heldout_fraction: float = 0.05
    split_seed: int = 42
    regen: RegenConfig = field(default_factory=RegenConfig)
    max_length: int = 1024
    min_supervised: int = 14
    features: str = "cached"
    feature_dtype: str = "bfloat16"
    seed: int = 42
    shard_max_samples: int = 256
    progress: bool = True
    load_regen_target: Callable[[], Any] | None = None
    """loads the target in ``regen.dtype`` (called once, only when a split has prompts to answer)"""
    curation: Any = None
    """mixture-wide checks (:class:`dspark_lightning.data.prompts.curate.Curation`; ``None``: none)"""
    load_tokenizer: Callable[[], Any] | None = None
    """the target's tokenizer, for sources with ``min_tokens`` / ``max_tokens``"""

    def _regen_target(self) -> Any:
        if self.load_regen_target is None:
            raise UsageError("data.regen.dtype is set but this PrepareJob has no load_regen_target")
        if getattr(self, "_regen_target_obj", None) is None:
            self._regen_target_obj = self.load_regen_target()
        return self._regen_target_obj

    @property
    def paths(self) -> DataPaths:
        return DataPaths(Path(self.work_dir))

    def _tokenizer(self) -> Any:
        return self.load_tokenizer() if needs_tokenizer(self.sources) and self.load_tokenizer is not None else None

    @cached_property
    def prompts(self) -> dict[str, list]:
        kw = {"curation": self.curation, "tokenizer": self._tokenizer()}
        out = {s: mixture(self.sources, s, self.heldout_fraction, self.split_seed, **kw) for s in SPLITS}
        out["train"] = several_answers(out["train"], self.regen.answers_per_prompt)
        return out

    @cached_property
    def curation_report(self) -> Any:
        """What curation kept and dropped per source (:class:`dspark_lightning.data.prompts.curate.CurationReport`)."""
        return curated_mixture(self.sources, self.curation, self._tokenizer(), self.split_seed).report

    @cached_property
    def fingerprint(self) -> str:
        """16 hex digits of the sha256 of everything that changes the prepared data."""
        ids = {s: _prompts_sha256(ps) for s, ps in self.prompts.items()}
        key = {
            "target": self.target_id,
            "regen": self.regen.identity(),
            "seed": self.seed,
            "max_length": self.max_length,
            "min_supervised": self.min_supervised,
            "features": self.features,
            "feature_dtype": self.feature_dtype,
            "prompt_ids": ids,
            "cache_format": CACHE_FORMAT,
        }
        if self.curation is not None:  # older fingerprints (no curation) stay valid
            key["curation"] = self.curation.identity()
        return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def is_done(self) -> bool:
        """True when a merge of this very configuration finished (the final index matches the fingerprint)."""
        done = _read_json(self.paths.prepared)
        return done is not None and done.get("fingerprint") == self.fingerprint

    def run(self, rank: int = 0, world_size: int = 1) -> None:
        """One process doing everything: its rank's work, then (world size 1) the merge."""
        self.run_rank(rank, world_size)
        if world_size == 1:
            self.merge(world_size)

    # --- one rank ------------------------------------------------------------------------------------------------
    def run_rank(self, rank: int, world_size: int) -> dict[str, Any]:
        """Regenerate and extract this rank's slice of every split (reusing a finished rank); returns its record."""
        if not 0 <= rank < world_size:
            raise UsageError(f"rank {rank} is outside world_size {world_size}")
        rd = self.paths.rank_dir(self.fingerprint, rank, world_size)
        marker = rd / "done.json"
        done = _read_json(marker)
        if done is not None and done.get("fingerprint") == self.fingerprint:
            _log(f"rank {rank}/{world_size}: reusing finished outputs in {rd}")
            return done
        self._report_curation()
        target = self.load_target()
        checks.data_positions(target, {"max_length": self.max_length, "regen": asdict(self.regen)})  # before any work
        rd.mkdir(parents=True, exist_ok=True)
        stats: dict[str, Any] = {}
        for split in SPLITS:
            self._regenerate(target, split, rank, world_size, rd, stats)
        if self.features == "cached":
            for split in SPLITS:
                self._extract(target, split, rank, rd, stats)
        record = {"fingerprint": self.fingerprint, "rank": rank, "world_size": world_size, "stats": stats}
        atomic_write(marker, json.dumps(record, indent=2) + "\n")
        return record

    def _report_curation(self) -> None:
        report = self.curation_report
        if self.curation is not None or any(c["read"] != c["kept"] for c in report.sources.values()):
            _log("prompts per source after curation:\n" + report.summary())

    def _regenerate(self, target: Any, split: str, rank: int, world: int, rd: Path, stats: dict) -> None:
        mine = self.prompts[split][rank::world]
        part = rd / f"responses_{split}.jsonl"
        if not mine:
            return
        _log(f"rank {rank}/{world}: {split} responses ({len(mine)} prompts, {target.name}) -> {part}")
        t0 = time.perf_counter()
        if self.regen.dtype is not None:
            target = self._regen_target()
        extra = {} if self.regen.dtype is None else {"regen_dtype": self.regen.dtype}
        cfg = generation_settings(target, seed=self.seed, extra_settings=extra, **self.regen.settings())
        self._seed_from_merged(split, part, {p.id: p for p in mine}, cfg)
        capture = rd / f"captured_{split}" if self._captures() else None
        st = regenerate(target, mine, part, seed=self.seed, progress=self.progress, extra_settings=extra,
                        capture_dir=capture, **self.regen.settings())  # fmt: skip
        if st["written"]:  # a fully resumed stage keeps the statistics of the run that did the work
            stats[f"regenerate_{split}"] = {**st, "wall_s": time.perf_counter() - t0}
        fixed = f" ({st['fixed']} of them fixed text, not decoded)" if st.get("fixed") else ""
        _log(f"  {st['written']} written{fixed}, {st['skipped']} reused from the file")

    def _captures(self) -> bool:
        """Whether regeneration keeps its features for the cache (``regen.capture_features`` with cached features)."""
        return self.regen.capture_features and self.features == "cached"

    def _seed_from_merged(self, split: str, part: Path, prompts: dict[str, Any], cfg: dict[str, Any]) -> None:
        """Start a new rank file from an earlier merged JSONL (an older layout, or a recipe that changed elsewhere),
        so responses already paid for are kept: those whose prompt text is unchanged and that were generated with
        these settings (``cfg``, :func:`~.regenerate.generation_settings`); the others are generated again."""
        merged = self.paths.responses(split)
        if part.exists() or not merged.is_file() or not merged.stat().st_size:
            return
        rows = [r for r in load_conversations(merged)
                if r["id"] in prompts and _same_prompt(r, prompts[r["id"]]) and same_settings(r, cfg)]  # fmt: skip
        if rows:
            atomic_write(part, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))

    def _extract(self, target: Any, split: str, rank: int, rd: Path, stats: dict) -> None:
        out = rd / f"features_{split}"
        if out.exists():
            FeatureCache(out, expect=expected_meta(target, self.feature_dtype))
            _log(f"reusing rank feature cache {out}")
            return
        rows = tokenize_conversations(
            target, _rows(rd / f"responses_{split}.jsonl"), self.max_length, self.min_supervised, allow_empty=True
        )
        if not rows:
            return
        ntok = sum(len(r["input_ids"]) for r in rows)
        _log(f"feature cache {out}: " + describe_estimate(ntok, target, self.feature_dtype, len(rows)))
        t0 = time.perf_counter()
        captured = rd / f"captured_{split}"
        if self._captures() and captured.is_dir():
            stream = CapturedFeatureStream(target, rows, load_captured(captured), self.feature_dtype, self.max_length,
                                           progress=self.progress, min_supervised=self.min_supervised)  # fmt: skip
            source = {"feature_source": f"regeneration ({self.regen.dtype or str(target.dtype)}) where captured"}
        else:
            stream = extract_features(target, rows, feature_dtype=self.feature_dtype, progress=self.progress)
            source = {}
        meta = cache_meta(target, self.feature_dtype, split=split, **source)
        write_cache(
            stream,
            out,
            meta,
            shard_max_samples=self.shard_max_samples,
            progress=self.progress,
            shard_prefix=f"shard-r{rank:05d}",
        )
        stats[f"features_{split}"] = {
            "tokens": stream.stats.tokens,
            "samples": len(rows),
            "wall_s": time.perf_counter() - t0,
            "tokens_per_s": stream.stats.tokens_per_second,
            "cache_bytes": sum(f.stat().st_size for f in out.iterdir()),
        }
        if isinstance(stream, CapturedFeatureStream):  # the pass above ran only over the rows captures missed
            stats[f"features_{split}"].update(samples=len(stream.fallback), captured_samples=stream.captured_samples,
                                              captured_tokens=stream.captured_tokens,
                                              summary_s=round(stream.summary_s, 2))  # fmt: skip
            _log(f"  {stream.captured_samples} of {len(rows)} conversations cached from regeneration's features, "
                 f"{len(stream.fallback)} through the feature pass")  # fmt: skip

    # --- merge ---------------------------------------------------------------------------------------------------
    def merge(self, world_size: int) -> dict[str, Any]:
        """Rank 0's last step: merge every finished rank into the final files, then write ``prepared.json``."""
        dirs = [self.paths.rank_dir(self.fingerprint, r, world_size) for r in range(world_size)]
        records = [_read_json(d / "done.json") for d in dirs]
        missing = [r for r, rec in enumerate(records) if rec is None or rec.get("fingerprint") != self.fingerprint]
        if missing:
            raise UsageError(
                f"prepare --merge: ranks {missing} of {world_size} have not finished (no done.json below "
                f"{dirs[0].parent}); run them with --rank/--world_size {world_size} first"
            )
        splits: dict[str, Any] = {}
        for split in SPLITS:
            splits[split] = {"rows": self._merge_responses(split, dirs)}
            if self.features == "cached":
                parts = [d / f"features_{split}" for d in dirs if (d / f"features_{split}").exists()]
                if not parts:
                    raise UsageError(f"prepare: no {split} conversation kept enough supervised tokens for features")
                cache = FeatureCache(merge_caches(parts, self.paths.cache(split)))
                splits[split].update(samples=len(cache), shards=len(cache.index["shards"]))
                _log(f"merged {len(parts)} rank caches -> {self.paths.cache(split)} ({len(cache)} samples)")
        old = _read_json(self.paths.stats) or {}
        new = _merge_stats([rec["stats"] for rec in records])
        new["curation"] = self.curation_report.to_dict()
        atomic_write(self.paths.stats, json.dumps({**old, **new}, indent=2) + "\n")
        index = {"fingerprint": self.fingerprint, "world_size": world_size, "splits": splits}
        atomic_write(self.paths.prepared, json.dumps(index, indent=2) + "\n")
        return index

    def _merge_responses(self, split: str, dirs: list[Path]) -> int:
        """Concatenate the rank JSONLs in prompt order (the same file for any world size)."""
        by_id = {r["id"]: r for d in dirs for r in _rows(d / f"responses_{split}.jsonl")}
        rows = [by_id[p.id] for p in self.prompts[split] if p.id in by_id]
        if not rows:
            raise UsageError(f"prepare: no {split} responses were regenerated (all empty?)")
        atomic_write(self.paths.responses(split), "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        return len(rows)


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
    curation: Any = None,
):
    """The dataset of one split: a :class:`FeatureCache` (cached) or a list of tokenised rows (online)."""
    paths = DataPaths(Path(work_dir))
    if features == "cached":
        return FeatureCache(paths.cache(split), expect=expected_meta(target, feature_dtype))
    ids = {p.id for p in mixture(sources, split, heldout_fraction, split_seed, curation=curation,
                                 tokenizer=target.tokenizer)}  # fmt: skip
    return tokenized_split(target, paths, split, ids, max_length, min_supervised)
