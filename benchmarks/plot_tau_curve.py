"""Held-out τ̂ against the optimizer step of a `fit` run (every logger version, so resumed runs join up).

python benchmarks/plot_tau_curve.py outputs/smollm2_dspark_long --out benchmarks/results/img/tau_curve_long.png
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from dspark_lightning.plots import plt

KEYS = {"val/tau_hat": "all", "val/tau_hat_math": "math", "val/tau_hat_code": "code", "val/tau_hat_chat": "chat"}


def history(run: Path) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, dict[int, float]] = {k: {} for k in KEYS}
    for f in sorted((run / "csv").glob("version_*/metrics.csv")):
        for row in csv.DictReader(open(f)):
            for k in KEYS:
                if row.get(k):
                    out[k][int(row["step"])] = float(row[k])
    return {k: sorted(v.items()) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="a recipe's default_root_dir")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    h = history(Path(a.run))
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for k, label in KEYS.items():
        if h[k]:
            ax.plot(*zip(*h[k], strict=True), marker="o", label=label, lw=2.2 if label == "all" else 1.2)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("held-out τ̂ (T = 1, teacher-forced)")
    ax.set_title(Path(a.run).name)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(a.out, dpi=110)
    for k, label in KEYS.items():
        print(label, " ".join(f"{s}:{v:.3f}" for s, v in h[k]))


if __name__ == "__main__":
    main()
