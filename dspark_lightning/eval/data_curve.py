"""How much data: acceptance against training samples and epochs, measured on arms, fitted, inverted.

An *arm* is a recipe trained on the first ``samples`` of its prepared training conversations (``data.features``'
``train_samples``, nested subsets of one preparation) for ``epochs`` passes, counted in optimizer steps, then decoded at
T = 0 with a fixed block (static γ, batch 1) on held-out prompts of each set (math / code / chat). Each arm keeps its
per-prompt counts (rounds, tokens per round, first-slot acceptances), so a metric's interval is a bootstrap over prompts
(paired: every arm decodes the same prompts).

Per set and epoch count the metric is fitted against samples ``n`` by a saturating curve with a fixed floor,

    y(n) = lo + (hi - lo) * n / (n + h)        (τ: lo = 1; A_1: lo = 0)

two parameters (the ceiling ``hi`` and the half-way sample count ``h``), least squares; inverted, a wanted ``y*`` needs
``n = h (y* - lo) / (hi - y*)`` samples (none when ``y* >= hi``). The intervals of the fit and of the inversion are
the bootstrap's 2.5-97.5 % percentiles: they hold the decoding noise of the measured points, not the spread between
training seeds.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..checks import UsageError
from ..data.prompts.evalsets import heldout_prompts as heldout_prompts  # read by data-curve and its benchmarks
from ..data.prompts.sources import DOMAINS as SETS

FLOORS = {"tau": 1.0, "A_1": 0.0}  # the value of a drafter that never drafts right


@dataclass
class Arm:
    samples: int
    epochs: float

    @property
    def name(self) -> str:
        return f"n{self.samples}_e{self.epochs:g}"

    def steps(self, batch_size: int) -> int:
        """Optimizer steps of ``epochs`` passes over ``samples`` conversations in batches of ``batch_size``."""
        return max(1, math.ceil(self.epochs * self.samples / batch_size))


@dataclass
class Counts:
    """One prompt's decode: request-rounds, tokens committed over them (bonus included), rounds whose first draft
    was accepted."""

    rounds: int
    tokens: int
    first: int


@dataclass
class ArmResult:
    arm: Arm
    steps: int
    counts: dict[str, list[Counts]]  # set -> per-prompt counts, same prompt order in every arm
    info: dict[str, Any] = field(default_factory=dict)

    def metric(self, name: str, s: str, idx: np.ndarray | None = None) -> float:
        rows = self.counts[s] if idx is None else [self.counts[s][i] for i in idx]
        rounds = sum(c.rounds for c in rows)
        if rounds == 0:
            return math.nan
        return sum(c.tokens if name == "tau" else c.first for c in rows) / rounds

    def to_json(self) -> dict[str, Any]:
        return {"arm": asdict(self.arm), "steps": self.steps, "info": self.info,
                "counts": {s: [asdict(c) for c in cs] for s, cs in self.counts.items()}}  # fmt: skip

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ArmResult:
        counts = {s: [Counts(**c) for c in cs] for s, cs in doc["counts"].items()}
        return cls(Arm(**doc["arm"]), doc["steps"], counts, doc.get("info", {}))


def decode_counts(target: Any, drafter: Any, prompts: Sequence[str], *, gamma: int, max_new_tokens: int,
                  progress: Any = None) -> list[Counts]:  # fmt: skip
    """Decode each prompt alone (batch 1, T = 0, static γ): its rounds, committed tokens and first-slot hits."""
    from ..infer import decode

    out = []
    for text in prompts:
        s = decode(target, drafter, [target.encode_prompt(text)], max_new_tokens=max_new_tokens, temperature=0.0,
                   scheduler={"class_path": "static", "init_args": {"gamma": gamma}}, batch_size=1).stats  # fmt: skip
        first = s.survival[0] if s.survival and s.survival[0] is not None else 0.0
        out.append(Counts(s.rounds, round(s.tau * s.rounds), round(first * s.rounds)))
        if progress is not None:
            progress.update(1)
    return out


# -- the fit --------------------------------------------------------------------------------------------------------

HALF_GRID = np.logspace(0, 7, 701)  # candidate half-way sample counts h, 1 .. 10^7


@dataclass
class Fit:
    lo: float
    hi: float
    half: float
    saturating: bool  # False: the best h is the grid's largest; the points show no bend yet (hi is then unreliable)

    def __call__(self, n: np.ndarray | float) -> np.ndarray | float:
        n = np.asarray(n, dtype=float)
        return self.lo + (self.hi - self.lo) * n / (n + self.half)

    def samples_for(self, want: float) -> float:
        """Samples this curve needs to reach ``want`` (inf when it never does)."""
        if want <= self.lo:
            return 0.0
        if want >= self.hi:
            return math.inf
        return self.half * (want - self.lo) / (self.hi - want)


def fit_saturating(n: Sequence[float], y: Sequence[float], lo: float) -> Fit:
    """Least-squares fit of ``y = lo + (hi - lo) n / (n + h)``: for each h of a log grid the best ``hi`` in closed
    form, then the h of least squared error. Needs two points or more with distinct ``n``."""
    n, y = np.asarray(n, dtype=float), np.asarray(y, dtype=float)
    ok = np.isfinite(y)
    n, y = n[ok], y[ok]
    if len(set(n.tolist())) < 2:
        raise UsageError("a saturating fit needs measured points at two sample counts or more")
    g = n[None, :] / (n[None, :] + HALF_GRID[:, None])  # (H, P)
    scale = (g * (y - lo)).sum(1) / (g * g).sum(1)  # best hi - lo for each h
    err = ((lo + scale[:, None] * g - y) ** 2).sum(1)
    k = int(np.argmin(err))
    return Fit(lo, float(lo + scale[k]), float(HALF_GRID[k]), saturating=k < len(HALF_GRID) - 1)


@dataclass
class Curve:
    """A metric's fit for one set and epoch count, with the bootstrap's interval of the measured points."""

    metric: str
    set: str
    epochs: float
    samples: list[int]
    measured: list[float]
    interval: list[tuple[float, float]]
    fit: Fit
    fits: list[Fit]  # the bootstrap's refits

    def samples_for(self, want: float) -> tuple[float, float, float]:
        """(fit, 2.5 %, 97.5 %) samples needed for ``want``; inf where a curve never reaches it."""
        never = 1e30  # a refit that never reaches ``want`` ranks above every finite count
        boot = np.minimum([f.samples_for(want) for f in self.fits], never)
        qs = [float(q) for q in np.percentile(boot, [2.5, 97.5])] if len(boot) else [math.nan, math.nan]
        return (self.fit.samples_for(want), *(math.inf if q >= never else q for q in qs))

    def predict(self, n: float) -> tuple[float, float, float]:
        boot = np.array([f(n) for f in self.fits])
        return float(self.fit(n)), float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))


def fit_curves(results: Sequence[ArmResult], metric: str, *, upto: int | None = None, boot: int = 300,
               seed: int = 0) -> list[Curve]:  # fmt: skip
    """One :class:`Curve` per set and epoch count of ``results`` (arms with ``samples <= upto`` when given)."""
    rng = np.random.default_rng(seed)
    lo = FLOORS[metric]
    curves = []
    for epochs in sorted({r.arm.epochs for r in results}):
        arms = sorted((r for r in results if r.arm.epochs == epochs and (upto is None or r.arm.samples <= upto)),
                      key=lambda r: r.arm.samples)  # fmt: skip
        if len({r.arm.samples for r in arms}) < 2:
            continue
        for s in SETS:
            if not all(s in r.counts for r in arms):
                continue
            n = [r.arm.samples for r in arms]
            size = min(len(r.counts[s]) for r in arms)
            draws = [rng.integers(0, size, size) for _ in range(boot)]
            ys = np.array([[r.metric(metric, s, idx) for r in arms] for idx in draws])  # (B, arms)
            measured = [r.metric(metric, s) for r in arms]
            interval = [(float(np.percentile(ys[:, j], 2.5)), float(np.percentile(ys[:, j], 97.5)))
                        for j in range(len(arms))]  # fmt: skip
            fits = [fit_saturating(n, row, lo) for row in ys]
            curves.append(Curve(metric, s, epochs, n, measured, interval, fit_saturating(n, measured, lo), fits))
    return curves


# -- reports --------------------------------------------------------------------------------------------------------


def _num(x: float, fmt: str = "{:,.0f}") -> str:
    return "never" if math.isinf(x) else ("–" if math.isnan(x) else fmt.format(x))


def arms_table(results: Sequence[ArmResult], boot: int = 300) -> str:
    """Markdown: one row per arm, τ and A_1 per set with the bootstrap interval."""
    rng = np.random.default_rng(0)
    head = "| samples | epochs | steps | " + " | ".join(f"τ {s}" for s in SETS) + " | "
    head += " | ".join(f"A_1 {s}" for s in SETS) + " |"
    lines = [head, "|" + "---|" * (3 + 2 * len(SETS))]
    for r in sorted(results, key=lambda r: (r.arm.epochs, r.arm.samples)):
        cells = [f"{r.arm.samples:,}", f"{r.arm.epochs:g}", f"{r.steps:,}"]
        for metric in ("tau", "A_1"):
            for s in SETS:
                if s not in r.counts:
                    cells.append("–")
                    continue
                size = len(r.counts[s])
                ys = [r.metric(metric, s, rng.integers(0, size, size)) for _ in range(boot)]
                lo, hi = np.percentile(ys, [2.5, 97.5])
                cells.append(f"{r.metric(metric, s):.3f} [{lo:.2f}, {hi:.2f}]")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def needs_table(curves: Sequence[Curve], want: float, batch_size: int) -> str:
    """Markdown: per set and epoch count, the samples (and steps) a wanted τ needs, with the fit's ceiling."""
    lines = [f"| set | epochs | τ ceiling (fit) | half-way samples | samples for τ = {want:g} [95 %] | steps |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for c in curves:
        if c.metric != "tau":
            continue
        n, lo, hi = c.samples_for(want)
        steps = "never" if math.isinf(n) else f"{math.ceil(n * c.epochs / batch_size):,}"
        bend = "" if c.fit.saturating else " (no bend yet)"
        lines.append(f"| {c.set} | {c.epochs:g} | {c.fit.hi:.2f}{bend} | {_num(c.fit.half)} | "
                     f"{_num(n)} [{_num(lo)}, {_num(hi)}] | {steps} |")  # fmt: skip
    return "\n".join(lines)


def prediction_rows(curves: Sequence[Curve], results: Sequence[ArmResult], upto: int) -> list[dict[str, Any]]:
    """Each arm above ``upto`` samples against the prediction of curves fitted on the arms up to ``upto``."""
    rows = []
    for c in curves:
        for r in results:
            if r.arm.epochs == c.epochs and r.arm.samples > upto and c.set in r.counts:
                pred, lo, hi = c.predict(r.arm.samples)
                got = r.metric(c.metric, c.set)
                rows.append({"metric": c.metric, "set": c.set, "epochs": c.epochs, "samples": r.arm.samples,
                             "predicted": round(pred, 4), "interval": [round(lo, 4), round(hi, 4)],
                             "measured": round(got, 4), "error": round(got - pred, 4)})  # fmt: skip
    return rows


def plot_curves(curves: Sequence[Curve], path: str | Path, title: str = "", want: float | None = None) -> Path:
    """τ (top) and A_1 (bottom) against training samples, one panel per set, one colour per epoch count: measured
    points with their interval, the fitted curve dashed."""
    from ..plots import plt
    from .report import save_plot

    sets = [s for s in SETS if any(c.set == s for c in curves)]
    fig, axes = plt.subplots(2, len(sets), figsize=(4.2 * len(sets), 7), squeeze=False)
    epochs = sorted({c.epochs for c in curves})
    colours = dict(zip(epochs, plt.cm.viridis(np.linspace(0.1, 0.8, len(epochs))), strict=True))
    for row, metric in enumerate(("tau", "A_1")):
        for col, s in enumerate(sets):
            ax = axes[row][col]
            for c in (c for c in curves if c.metric == metric and c.set == s):
                x = np.array(c.samples, dtype=float)
                err = np.abs(np.array(c.interval).T - np.array(c.measured))
                ax.errorbar(x, c.measured, yerr=err, fmt="o", color=colours[c.epochs], capsize=3,
                            label=f"{c.epochs:g} epochs")  # fmt: skip
                grid = np.geomspace(x.min() / 2, x.max() * 4, 100)
                ax.plot(grid, c.fit(grid), "--", color=colours[c.epochs], alpha=0.8)
            if metric == "tau" and want is not None:
                ax.axhline(want, color="grey", lw=0.8, ls=":")
            ax.set_xscale("log")
            ax.set_title(f"{s}: {'τ' if metric == 'tau' else 'A_1'}")
            ax.set_xlabel("training conversations")
            ax.grid(alpha=0.3)
            if col == 0:
                ax.legend(fontsize=8)
    if title:  # wrapped to the figure's width (about 13 characters an inch at this size)
        fig.suptitle(textwrap.fill(title, int(13 * fig.get_figwidth())), fontsize=10)
    return save_plot(fig, path, dpi=110)
