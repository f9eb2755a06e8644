"""The prompt-sampling floor of a held-out ECE: how far apart two random halves of the prompts sit in base rate.

    python benchmarks/confidence_floor.py benchmarks/results/data/confidence/{make_run,long}_T{0,1}/rollouts.pt

``calibrate`` fits its maps on half of the prompts and scores them on the other half. Rounds of one prompt are
alike (a math prompt accepts more at every round), so the survival's base rate at position k differs between
the halves by chance, and a map that is perfect on the fit half is off by that gap on the held-out one. The
row-level floor ``confidence.json`` carries (``ece_floor``: Bernoulli labels drawn row by row) does not see it.
For each rollouts file (``confidence_bench.py`` leaves one per drafter and temperature) and position k = 1-3 this
prints the median and mean |base-rate gap| over 400 random halvings of its prompts, and writes the table to
``prompt_floor.md`` beside the first file's folder.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from dspark_lightning.atomic import atomic_write


def gaps(path: Path, positions=(1, 2, 3), draws: int = 400) -> list[tuple[int, int, int, float, float, float]]:
    """(k, prompts, rows, mean survival, median gap, mean gap) per position."""
    r = torch.load(path, weights_only=True)
    m, ell, prompt = r["m"], r["ell"], r["prompt"]
    g = torch.Generator().manual_seed(0)
    ids = prompt.unique()
    out = []
    for k in positions:
        mask = ell >= k
        y, pr = (m[mask] >= k).float(), prompt[mask]
        d = []
        for _ in range(draws):
            half = torch.isin(pr, ids[torch.randperm(len(ids), generator=g)][: len(ids) // 2])
            d.append(abs(y[half].mean() - y[~half].mean()).item())
        d = torch.tensor(d)
        out.append((k, len(ids), int(mask.sum()), y.mean().item(), d.median().item(), d.mean().item()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rollouts", nargs="+", type=Path)
    a = ap.parse_args()
    lines = [
        "| rollouts | k | prompts | rows | mean survival | base-rate gap, median / mean (pts) |",
        "|---|---|---|---|---|---|",
    ]
    for path in a.rollouts:
        for k, n, rows, mean, med, avg in gaps(path):
            gap = f"{100 * med:.1f} / {100 * avg:.1f}"
            lines.append(f"| {path.parent.name} | {k} | {n} | {rows:,} | {mean:.3f} | {gap} |")
    text = "\n".join(lines)
    print(text)
    atomic_write(a.rollouts[0].parent.parent / "prompt_floor.md", text + "\n")


if __name__ == "__main__":
    main()
