"""Decoded acceptance against training budget (benchmarks/results/matrix.md, "Decoded acceptance against budget").

The matrix's budget fit reads teacher-forced agreement on the training sources' held-out split, which the eval
prompts do not follow for code and chat. This fits what the bars are stated in: the decoded A_1 and τ of drafters
trained for several budgets, on the built-in eval prompts (static γ = 7, T = 0, batch 1), against log10(anchor
blocks seen), and extrapolates the anchors (and training minutes at the cells' measured rate) each bar needs.

    python benchmarks/matrix.py --cells benchmarks/budget_cells.yaml --only best_bf16 --minutes 3 6 12 \
        --out benchmarks/results/data/budget
    python benchmarks/decoded_fit.py --cells benchmarks/results/data/budget --name best_bf16 \
        --out benchmarks/results/data/budget_decoded \
        --point long=634000:benchmarks/results/data/acceptance_long/acceptance.json

Each cell's drafter is probed with benchmarks/acceptance_probe.py into <out>/probe/<cell>/ unless that folder holds
a finished probe (acceptance probes are deterministic, so they may share the machine; the cells may not).
Writes <out>/decoded_fit.json, decoded_fit.md and decoded_fit.png.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from dspark_lightning.atomic import atomic_write, atomic_writer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
BARS = {"math": {"A_1": 0.65, "tau": 2.5}, "code": {"A_1": 0.65, "tau": 2.5}, "chat": {"A_1": 0.5}}


def probe(drafter: str, out: Path, prompts: int) -> dict:
    """The T = 0, γ = 7 rows of a drafter's acceptance probe (run once into ``out``)."""
    done = out / "acceptance.json"
    if not done.is_file():
        import acceptance_probe

        acceptance_probe.main(["--drafter", drafter, "--prompts_per_domain", str(prompts), "--gammas", "7",
                               "--temperatures", "0", "--out", str(out)])  # fmt: skip
    rows = json.loads(done.read_text())["rows"]
    return {r["set"]: {"A_1": r["A_k"][0], "tau": r["tau"]} for r in rows if r["T"] == 0 and r["gamma"] == 7}


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares y = a + b log10(x): (a, b)."""
    lx = [math.log10(x) for x in xs]
    mx, my = sum(lx) / len(lx), sum(ys) / len(ys)
    sxx = sum((v - mx) ** 2 for v in lx)
    b = sum((u - mx) * (v - my) for u, v in zip(lx, ys, strict=True)) / sxx
    return my - b * mx, b


def needed(a: float, b: float, bar: float) -> float | None:
    """Anchors at which the fitted line reaches ``bar`` (None when it does not rise)."""
    return 10 ** ((bar - a) / b) if b > 1e-9 else None


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", required=True, help="benchmarks/matrix.py output folder with the budget cells")
    ap.add_argument("--name", required=True, help="the cell name run at several budgets")
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompts_per_domain", type=int, default=10)
    ap.add_argument("--point", action="append", default=[], help="LABEL=ANCHORS:ACCEPTANCE_JSON, shown, not fitted")
    a = ap.parse_args(argv)
    out = Path(a.out)
    cells = sorted((json.loads(p.read_text()) for p in Path(a.cells).glob(f"{a.name}-*m.json")),
                   key=lambda c: c["anchors_seen"])  # fmt: skip
    if len(cells) < 2:
        raise SystemExit(f"decoded_fit: need the cell {a.name!r} at >= 2 budgets in {a.cells}, found {len(cells)}")
    points = []
    for c in cells:
        tag = f"{c['name']}-{c['minutes']:g}m"
        points.append({"label": tag, "anchors": c["anchors_seen"], "minutes": c["minutes"],
                       "anchors_per_min": c["anchors_seen"] / (c["train_wall_s"] / 60),
                       "sets": probe(str(ROOT / c["drafter"]), out / "probe" / tag, a.prompts_per_domain)})  # fmt: skip
    extra = []
    for spec in a.point:
        label, _, rest = spec.partition("=")
        n, _, path = rest.partition(":")
        rows = json.loads(Path(path).read_text())["rows"]
        sets = {r["set"]: {"A_1": r["A_k"][0], "tau": r["tau"]} for r in rows if r["T"] == 0 and r["gamma"] == 7}
        extra.append({"label": label, "anchors": float(n), "sets": sets})
    rate = sum(p["anchors_per_min"] for p in points) / len(points)
    doc = {"cell": a.name, "anchors_per_train_min": rate, "points": points, "extra": extra,
           "fits": fits_of(points, rate)}  # fmt: skip
    if extra:  # the same fit with the extra points in it: does a longer run stay on the cells' line?
        doc["fits_with_extra"] = fits_of(points + extra, rate)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "decoded_fit.json", json.dumps(doc, indent=1) + "\n")
    atomic_write(out / "decoded_fit.md", markdown(doc))
    plot(doc, out / "decoded_fit.png")
    print(markdown(doc))


def fits_of(points: list[dict], rate: float) -> dict:
    """Per bar: the log-linear fit over ``points`` and the anchors (training minutes at ``rate``) it reaches it."""
    fits = {}
    for dom, bars in BARS.items():
        xs = [p["anchors"] for p in points]
        for metric, bar in bars.items():
            ys = [p["sets"][dom][metric] for p in points]
            icpt, slope = fit(xs, ys)
            n = needed(icpt, slope, bar)
            fits[f"{dom}/{metric}"] = {
                "intercept": icpt, "slope_per_decade": slope, "bar": bar, "measured": ys,
                "anchors_needed": n, "train_minutes_needed": None if n is None else n / rate,
            }  # fmt: skip
    return fits


def markdown(doc: dict) -> str:
    lines = ["| point | anchors | A_1 math / code / chat | τ math / code / chat |", "|---|---|---|---|"]
    for p in doc["points"] + doc["extra"]:
        s = p["sets"]
        a1 = " / ".join(f"{s[d]['A_1']:.2f}" for d in ("math", "code", "chat"))
        tau = " / ".join(f"{s[d]['tau']:.3f}" for d in ("math", "code", "chat"))
        lines.append(f"| {p['label']} | {p['anchors'] / 1e3:,.0f} k | {a1} | {tau} |")
    for title, key in (("the budget cells", "fits"), ("the budget cells and the extra points", "fits_with_extra")):
        if key not in doc:
            continue
        rate = f"{doc['anchors_per_train_min'] / 1e3:.1f} k anchors/min"
        head = f"| bar | slope per decade of anchors | anchors needed | training minutes (at {rate}) |"
        lines += ["", f"Fit over {title}:", "", head, "|---|---|---|---|"]
        for bar, f in doc[key].items():
            n = f["anchors_needed"]
            need = "not on a rising line" if n is None else f"{n / 1e6:,.2f} M"
            mins = "–" if n is None else f"{f['train_minutes_needed']:,.0f}"
            lines.append(f"| {bar} ≥ {f['bar']} | {f['slope_per_decade']:+.3f} | {need} | {mins} |")
    return "\n".join(lines) + "\n"


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    colors = {"math": "C0", "code": "C1", "chat": "C2"}
    xs = [p["anchors"] for p in doc["points"]]
    lo, hi = math.log10(min(xs)), max(math.log10(max(xs)) + 1.5, 6.5)
    for ax, metric in zip(axes, ("A_1", "tau"), strict=True):
        for dom, c in colors.items():
            ax.plot([math.log10(x) for x in xs], [p["sets"][dom][metric] for p in doc["points"]], "o", c=c, label=dom)
            for p in doc["extra"]:
                ax.plot(math.log10(p["anchors"]), p["sets"][dom][metric], "x", c=c, ms=9)
            f = doc["fits"].get(f"{dom}/{metric}")
            if f:
                ax.plot([lo, hi], [f["intercept"] + f["slope_per_decade"] * v for v in (lo, hi)], "--", c=c, lw=1)
                ax.axhline(f["bar"], c=c, ls=":", lw=0.8)
            g = doc.get("fits_with_extra", {}).get(f"{dom}/{metric}")
            if g:
                ax.plot([lo, hi], [g["intercept"] + g["slope_per_decade"] * v for v in (lo, hi)], "-.", c=c, lw=0.7)
        ax.set_xlabel("log10(anchor blocks seen)")
        ax.set_ylabel(f"decoded {metric} (T = 0, γ = 7, eval prompts)")
        ax.grid(alpha=0.3)
    extra = ", ".join(p["label"] for p in doc["extra"])
    axes[0].legend(title=f"o: budget cells (fit --), x: {extra} (fit with it -.)", fontsize=8, title_fontsize=8)
    fig.tight_layout()
    with atomic_writer(path) as f:  # all or nothing, as every writer of the project
        fig.savefig(f, format="png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
