"""Tables (JSON + Markdown) and a plot for the small-budget ablations (benchmarks/ablations.queue;
benchmarks/results/results_log.md §5.5).

    python benchmarks/ablation_tables.py --out benchmarks/results/data/ablations

Reads each variant's held-out validation at the end of training (outputs/ablations/<variant>/csv: the
teacher-forced expected τ̂ = 1 + Σ_k Π_{i<=k} c*_i at T = 1, per domain, c* = Σ min(p_target, q_draft))
and its budget (fit_stats.json: steps, tokens, wall time).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from training_table import DOMAINS, read_run  # noqa: E402

# run name (benchmarks/ablations.queue) -> (drafter, layers, γ, head); the sweeps share their reference points
VARIANTS = {
    "dspark-L1-g7-vanilla": ("dspark", 1, 7, "vanilla"),
    "dspark-L2-g7-vanilla": ("dspark", 2, 7, "vanilla"),
    "dspark-L5-g7-vanilla": ("dspark", 5, 7, "vanilla"),
    "dspark-L1-g3-vanilla": ("dspark", 1, 3, "vanilla"),
    "dspark-L1-g11-vanilla": ("dspark", 1, 11, "vanilla"),
    "dspark-L1-g15-vanilla": ("dspark", 1, 15, "vanilla"),
    "dspark-L1-g7-gated": ("dspark", 1, 7, "gated"),
    "dspark-L1-g7-rnn": ("dspark", 1, 7, "rnn"),
    "dflash-L1-g7": ("dflash", 1, 7, None),
    "dflash-L5-g7": ("dflash", 5, 7, None),
    "dflash-L1-g3": ("dflash", 1, 3, None),
    "dflash-L1-g11": ("dflash", 1, 11, None),
    "dflash-L1-g15": ("dflash", 1, 15, None),
}

SWEEPS = {  # sweep -> (row label, dspark variant, dflash variant or None)
    "depth": [
        ("1 layer", "dspark-L1-g7-vanilla", "dflash-L1-g7"),
        ("2 layers", "dspark-L2-g7-vanilla", None),
        ("5 layers", "dspark-L5-g7-vanilla", "dflash-L5-g7"),
    ],
    "block": [
        (f"γ = {g} (draft length {g + 1})", f"dspark-L1-g{g}-vanilla", f"dflash-L1-g{g}") for g in (3, 7, 11, 15)
    ],
    "head": [(f"{h}", f"dspark-L1-g7-{h}", None) for h in ("vanilla", "gated", "rnn")],
}


def read_variant(root: Path, name: str) -> dict | None:
    run = read_run(root / name)
    if run is None:
        return None
    drafter, layers, gamma, head = VARIANTS[name]
    return run | {"drafter": drafter, "layers": layers, "block_size": gamma, "head": head}


def _cell(v: dict | None, key: str) -> str:
    return "–" if v is None or key not in v else f"{v[key]:.3f}"


def sweep_markdown(sweep: str, rows: list[dict]) -> str:
    with_dflash = any(r["dflash_variant"] for r in rows)
    head = ["setting", *(f"DSpark {d}" for d in DOMAINS), "DSpark all"]
    if with_dflash:
        head += [*(f"DFlash {d}" for d in DOMAINS), "DFlash all", "gain (all)"]
    head += ["DSpark wall s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        s, f = r["dspark"], r["dflash"]
        cells = [r["label"], *(_cell(s, d) for d in DOMAINS), _cell(s, "tau_hat")]
        if with_dflash:
            gain = "–" if s is None or f is None else f"{s['tau_hat'] / f['tau_hat'] - 1:+.1%}"
            cells += [*(_cell(f, d) for d in DOMAINS), _cell(f, "tau_hat"), gain]
        cells.append("–" if s is None else f"{s['wall_s']:.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(tables: dict, path: Path) -> None:
    from dspark_lightning.plots import plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for ax, (sweep, rows) in zip(axes, tables.items(), strict=True):
        x = range(len(rows))
        for key, label in (("dspark", "DSpark"), ("dflash", "DFlash")):
            ys = [r[key]["tau_hat"] if r[key] else None for r in rows]
            pts = [(i, y) for i, y in zip(x, ys, strict=True) if y is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=label)
        ax.set_xticks(list(x), [r["label"].split(" (")[0] for r in rows], fontsize=8)
        ax.set_title(sweep)
        ax.set_ylabel("held-out τ̂ (T = 1)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", default="outputs/ablations")
    ap.add_argument("--out", default="benchmarks/results/data/ablations")
    a = ap.parse_args()
    root, out = Path(a.runs), Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tables = {}
    for sweep, spec in SWEEPS.items():
        rows = [
            {
                "label": label,
                "dspark_variant": s,
                "dflash_variant": f,
                "dspark": read_variant(root, s),
                "dflash": read_variant(root, f) if f else None,
            }
            for label, s, f in spec
        ]
        tables[sweep] = rows
        (out / f"{sweep}.json").write_text(json.dumps(rows, indent=1) + "\n")
        md = sweep_markdown(sweep, rows)
        (out / f"{sweep}.md").write_text(md + "\n")
        print(f"## {sweep}\n\n{md}\n")
    plot(tables, out / "ablations.png")
    print(f"-> {out}")


if __name__ == "__main__":
    main()
