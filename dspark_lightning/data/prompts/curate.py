"""What `prepare` keeps of a prompt mixture: filters per source, decontamination, de-duplication, sampling, weights.

Per source (keys of a ``data.sources`` entry, next to the source's own arguments)::

    {class_path: sharegpt_v3, init_args: {language: en, min_tokens: 4, max_tokens: 256, sample: 3000, weight: 1.0}}

- ``min_tokens`` / ``max_tokens``: bounds on the user turns' length in the target's tokens (all turns together);
- ``language``: keep prompts whose prose (code blocks removed) py3langid reads as this ISO 639-1 code; a prompt with
  too little prose to tell is kept;
- ``sample``: keep N prompts that pass every check, taken in a seeded hash order of their ids (deterministic, and a
  larger N keeps the smaller one's prompts); without it the source's own order, up to its ``limit``;
- ``weight``: how often the source's conversations are seen per training epoch (2.0: twice; 0.5: a fixed half).

For the whole mixture (``data.curation``, a :class:`Curation`): training prompts that overlap a held-out set are
dropped (decontamination), then exact and near duplicates of an earlier prompt (earlier sources win). Every drop is
counted per source and reason in a :class:`CurationReport`, which `prepare` prints and records in
``prepare_stats.json``; the settings are part of the data's fingerprint.

Decontamination compares word n-grams (lowercased, ``ngram`` words): a training prompt is dropped when it contains at
least ``overlap`` of some held-out item's n-grams, where n-grams shared by many held-out items (instructions a set
repeats, like HumanEval's) do not count. Held-out sets: ``eval`` (the evaluation and calibration prompts of
:mod:`~dspark_lightning.data.prompts.evalsets`), ``benchmarks`` (the public benchmarks whose text ships offline:
HumanEval, MT-Bench; GSM8K, MATH, MBPP, LiveCodeBench, Arena-Hard and AlpacaEval do not, pass saved copies by path),
or a path to any file or dataset :mod:`~dspark_lightning.data.prompts.formats` reads. A source that *is* a public
benchmark (or derived from one, as GSM-Symbolic is from GSM8K's test split) is refused in a mixture checked
against ``benchmarks``.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from ...checks import UsageError
from .sources import _unit_interval, build_source

log = logging.getLogger(__name__)

_WORD = re.compile(r"[a-z0-9]+")
_CODE_BLOCK = re.compile(r"```.*?(```|$)", re.S)


@dataclass
class Curation:
    """Mixture-wide checks (see the module docstring)."""

    decontaminate: list[str] = field(default_factory=lambda: ["eval", "benchmarks"])
    """held-out sets no training prompt may overlap: ``eval``, ``benchmarks`` and/or paths to files or datasets"""
    ngram: int = 8
    """words per n-gram of the overlap test"""
    overlap: float = 0.5
    """fraction of a held-out item's n-grams a training prompt may not reach"""
    dedupe: str = "near"
    """``none``, ``exact`` (the same text after case and whitespace) or ``near`` (also MinHash Jaccard >= near)"""
    near: float = 0.8
    """Jaccard similarity of word 5-gram sets above which two prompts are near duplicates"""

    def __post_init__(self) -> None:
        if self.dedupe not in ("none", "exact", "near"):
            raise UsageError(f"data.curation.dedupe must be none, exact or near, got {self.dedupe!r}")
        if not 0.0 < self.overlap <= 1.0:
            raise UsageError(f"data.curation.overlap must be in (0, 1], got {self.overlap}")
        if not 0.0 < self.near <= 1.0:
            raise UsageError(f"data.curation.near must be in (0, 1], got {self.near}")
        if self.ngram < 1:
            raise UsageError(f"data.curation.ngram must be >= 1, got {self.ngram}")
        self.decontaminate = [str(x) for x in self.decontaminate]

    def identity(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CurationReport:
    """Per source: prompts read, dropped by reason, kept (``summary()`` is the table `prepare` prints)."""

    sources: dict[str, Counter] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

    def count(self, source: str, what: str, n: int = 1) -> None:
        self.sources.setdefault(source, Counter())[what] += n

    def to_dict(self) -> dict[str, Any]:
        return {"settings": self.settings, "sources": {k: dict(v) for k, v in self.sources.items()}}

    def summary(self) -> str:
        lines = []
        for src, c in self.sources.items():
            drops = ", ".join(f"{n} {k}" for k, n in sorted(c.items()) if k not in ("read", "kept") and n)
            lines.append(f"  {src}: {c['kept']} kept of {c['read']} read" + (f" (dropped: {drops})" if drops else ""))
        return "\n".join(lines)


# --- text ------------------------------------------------------------------------------------------------------------
def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def ngrams(tokens: list[str], n: int) -> set[tuple[str, ...]]:
    if len(tokens) < n:
        return {tuple(tokens)} if tokens else set()
    return {tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}


def prose(text: str) -> str:
    """The text without its fenced code blocks."""
    return _CODE_BLOCK.sub(" ", text)


class Decontaminator:
    """The n-gram overlap test against held-out texts (see the module docstring)."""

    def __init__(self, sets: dict[str, list[str]], n: int, overlap: float) -> None:
        self.n, self.overlap = n, overlap
        items = [(name, ngrams(words(t), n)) for name, texts in sets.items() for t in texts]
        df = Counter(g for _, grams in items for g in grams)
        common = max(3, len(items) // 100)  # an n-gram in this many items is a set's boilerplate, not its content
        self.index: dict[tuple[str, ...], list[int]] = defaultdict(list)
        self.items: list[tuple[str, int]] = []  # (set name, n-grams that count)
        for name, grams in items:
            own = [g for g in grams if df[g] < common]
            if not own:
                continue
            for g in own:
                self.index[g].append(len(self.items))
            self.items.append((name, len(own)))

    def __len__(self) -> int:
        return len(self.items)

    def match(self, text: str) -> str | None:
        """The held-out set a training text overlaps, or ``None``."""
        hits: Counter = Counter()
        for g in ngrams(words(text), self.n):
            for i in self.index.get(g, ()):
                hits[i] += 1
        for i, k in hits.items():
            name, total = self.items[i]
            if k >= self.overlap * total:
                return name
        return None


class Deduper:
    """Exact duplicates by normalised text; near duplicates by MinHash LSH over word 5-gram sets (datasketch)."""

    def __init__(self, mode: str, threshold: float) -> None:
        self.mode, self.seen = mode, set()
        self.lsh = None
        if mode == "near":
            from datasketch import MinHashLSH

            self.lsh = MinHashLSH(threshold=threshold, num_perm=64)
        self.n = 0

    def check(self, text: str) -> str | None:
        """``"duplicate"``, ``"near duplicate"`` or ``None`` (and then the text is remembered)."""
        if self.mode == "none":
            return None
        toks = words(text)
        key = hashlib.sha1(" ".join(toks).encode()).digest()
        if key in self.seen:
            return "duplicate"
        mh = None
        if self.lsh is not None and len(toks) >= 5:
            from datasketch import MinHash

            mh = MinHash(num_perm=64, seed=1)
            mh.update_batch([" ".join(g).encode() for g in ngrams(toks, 5)])
            if self.lsh.query(mh):
                return "near duplicate"
        self.seen.add(key)
        if mh is not None:
            self.lsh.insert(str(self.n), mh)
        self.n += 1
        return None


def language_of(text: str) -> str | None:
    """ISO 639-1 code of the text's prose (py3langid), or ``None`` when there is too little prose to tell."""
    body = prose(text)
    if sum(c.isalpha() for c in body) < 20:
        return None
    try:
        import py3langid
    except ImportError as exc:
        raise ImportError(f"the language filter needs py3langid: pip install py3langid ({exc})") from None
    return py3langid.classify(body[:2000])[0]


def reference_texts(names: list[str]) -> dict[str, list[str]]:
    """Held-out texts by set name for :class:`Decontaminator` (``eval``, ``benchmarks``, or paths)."""
    from .evalsets import held_out_texts
    from .formats import ReadReport, read_conversations
    from .sources import benchmark_texts

    out: dict[str, list[str]] = {}
    for name in names:
        if name == "eval":
            out.update(held_out_texts())
        elif name == "benchmarks":
            out.update(benchmark_texts())
        else:
            report = ReadReport(name)
            out[name] = [t for c in read_conversations(name, report) for t in c.turns]
            if not out[name]:
                raise UsageError(f"data.curation.decontaminate: {name} holds no readable prompts ({report.summary()})")
    return out


def sample_order(ids: Iterable[str], seed: int) -> list[int]:
    """Positions of ``ids`` in a seeded hash order (what ``sample`` takes from)."""
    keys = [hashlib.sha256(f"sample:{seed}:{i}".encode()).digest() for i in ids]
    return sorted(range(len(keys)), key=keys.__getitem__)


def curate(
    sources: list[tuple[str, Iterable[Any], dict[str, Any], str | None]],
    curation: Curation | None,
    count_tokens: Callable[[str], int] | None,
    seed: int = 42,
) -> tuple[list[Any], CurationReport]:
    """Apply the per-source options and the mixture-wide checks; returns (kept records in order, report).

    ``sources``: (label, records, options, benchmark the source is or derives from) per source, in mixture order.
    """
    report = CurationReport(settings={"curation": curation.identity() if curation else None})
    decon = None
    if curation is not None and curation.decontaminate:
        decon = Decontaminator(reference_texts(curation.decontaminate), curation.ngram, curation.overlap)
        report.settings["held_out_items"] = len(decon)
    dedupe = Deduper(curation.dedupe if curation else "none", curation.near if curation else 1.0)
    out: list[Any] = []
    for label, records, opts, benchmark in sources:
        if benchmark and curation is not None and "benchmarks" in curation.decontaminate:
            raise UsageError(
                f"source {label!r} is {benchmark}: a public benchmark may not be trained on in a mixture checked "
                "against `benchmarks` (data.curation.decontaminate); remove the source or that check"
            )
        if any(k in opts for k in ("min_tokens", "max_tokens")) and count_tokens is None:
            raise UsageError(f"source {label!r}: min_tokens / max_tokens need the target's tokenizer")
        recs = list(records)
        report.count(label, "read", len(recs))
        order = sample_order([r.id for r in recs], seed) if "sample" in opts else range(len(recs))
        want = opts.get("sample")
        kept = 0
        for i in order:
            if want is not None and kept >= want:
                break
            rec = recs[i]
            reason = _drop_reason(rec, opts, count_tokens, decon, dedupe)
            if reason:
                report.count(label, reason)
                continue
            kept += 1
            out.append(rec)
        report.count(label, "kept", kept)
        if want is not None and kept < want:
            log.warning("source %r: sample %d asked, %d prompts pass the checks", label, want, kept)
    return out, report


def _drop_reason(rec: Any, opts: dict, count_tokens, decon: Decontaminator | None, dedupe: Deduper) -> str | None:
    text = "\n".join(rec.turns)
    if "min_tokens" in opts or "max_tokens" in opts:
        n = count_tokens(text)
        if n < opts.get("min_tokens", 0):
            return "too short"
        if n > opts.get("max_tokens", 1 << 30):
            return "too long"
    if "language" in opts:
        lang = language_of(text)
        if lang is not None and lang != opts["language"]:
            return "other language"
    if decon is not None:
        hit = decon.match(text)
        if hit is not None:
            return f"overlaps {hit}"
    return dedupe.check(text)


def needs_tokenizer(sources: list[Any]) -> bool:
    """Whether a source filters by length in the target's tokens."""
    return any({"min_tokens", "max_tokens"} & set(getattr(build_source(s), "curation", {})) for s in sources)


def repeat_index(ids: list[str], weights: dict[str, float], seed: int) -> list[int]:
    """Dataset positions with each id repeated by its weight (default 1): floor(w) times, plus once more when the
    id's seeded hash falls below frac(w). Deterministic; the order is the dataset's (the loader shuffles)."""
    out: list[int] = []
    for i, sid in enumerate(ids):
        w = weights.get(sid, 1.0)
        whole, frac = int(w), w - int(w)
        out += [i] * (whole + (_unit_interval("weight", seed, sid) < frac))
    if not out:
        raise UsageError("the source weights leave no training sample (every weight < 1 and no sample drawn)")
    return out
