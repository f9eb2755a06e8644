"""Render benchmarks/results/benchmarks.md tables from a finished `fit` run directory.

    python benchmarks/bench_report.py outputs/smollm2_dspark [--time-log outputs/smollm2_dspark/time.log]

Reads data/prepare_stats.json, the newest tb/version_N/fit_stats.json and csv/version_N/metrics.csv, and
(optionally) the output of `/usr/bin/time -v` for the whole process's peak RSS and wall time.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
from pathlib import Path


def newest(run: Path, kind: str) -> Path:
    versions = sorted((run / kind).glob("version_*"), key=lambda p: int(p.name.split("_")[1]))
    if not versions:
        raise SystemExit(f"no {kind}/version_* under {run}")
    return versions[-1]


def tau_rows(metrics: Path) -> list[dict[str, str]]:
    return [r for r in csv.DictReader(metrics.open()) if r.get("val/tau_hat")]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run", type=Path)
    ap.add_argument("--time-log", type=Path)
    ap.add_argument("--data", type=Path, help="data dir whose prepare_stats.json to report (default: <run>/data)")
    a = ap.parse_args()
    prep_file = (a.data or a.run / "data") / "prepare_stats.json"
    prep = json.loads(prep_file.read_text()) if prep_file.exists() else {}  # runs that reuse another run's data
    fit = json.loads((newest(a.run, "tb") / "fit_stats.json").read_text())
    vals = tau_rows(newest(a.run, "csv") / "metrics.csv")

    print("| Stage | Wall time (s) | Throughput | Notes |")
    print("|---|---|---|---|")
    for split in ("train", "heldout"):
        r = prep.get(f"regenerate_{split}")
        if r:
            print(
                f"| regenerate ({split}) | {r['wall_s']:.0f} | {r['tokens_per_s']:.1f} generated tok/s | "
                f"{r['written']} conversations, {r['tokens']} tokens |"
            )
    for split in ("train", "heldout"):
        f = prep.get(f"features_{split}")
        if f:
            print(
                f"| feature cache ({split}) | {f['wall_s']:.0f} | {f['tokens_per_s']:.0f} tok/s | "
                f"{f['samples']} sequences, {f['tokens']} tokens, {f['cache_bytes'] / 1e6:.1f} MB on disk |"
            )
    print(
        f"| training | {fit['wall_s']:.0f} | {fit['tokens_per_s']:.0f} tok/s ({fit['block_rows_per_s']:.0f} "
        f"draft rows/s) | {fit['steps']} optimizer steps, incl. periodic validation |"
    )
    rss = fit["peak_rss_mib"]
    if a.time_log and a.time_log.exists():
        t = a.time_log.read_text()
        m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", t)
        w = re.search(r"Elapsed \(wall clock\) time.*: ([\d:.]+)", t)
        rss = int(m.group(1)) / 1024 if m else rss
        if w:
            print(f"| **whole command** | {w.group(1)} (h:mm:ss) | | includes imports, target load, validation |")
    print(f"\nPeak RSS: {rss:.0f} MiB.\n")

    doms = [k.removeprefix("val/tau_hat_") for k in vals[0] if k.startswith("val/tau_hat_")]
    gamma = max(int(m.group(1)) for k in vals[0] if (m := re.fullmatch(r"val/acc_pos(\d+)", k)))
    greedy = "val/tfa_pos1" in vals[0]  # T = 0 metrics (TF-A_1 per domain, greedy τ̂) since issue 18
    head = ["all", *doms, "acc@1", "acc@γ"] + (["TF-A_1 " + d for d in ["all", *doms]] + ["τ̂ (T=0)"] if greedy else [])
    print("| Step | " + " | ".join(head) + " |")
    print("|---" * (len(head) + 1) + "|")

    def num(r: dict, k: str) -> str:
        return f"{float(r[k]):.3f}" if r.get(k) else "–"

    for r in vals:
        cells = [num(r, "val/tau_hat"), *(num(r, f"val/tau_hat_{d}") for d in doms)]
        cells += [num(r, "val/acc_pos1"), num(r, f"val/acc_pos{gamma}")]
        if greedy:
            cells += [num(r, "val/tfa_pos1"), *(num(r, f"val/tfa_pos1_{d}") for d in doms), num(r, "val/tau_greedy")]
        print(f"| {r['step']} | " + " | ".join(cells) + " |")

    moe_report(newest(a.run, "csv") / "metrics.csv")


def moe_report(metrics: Path) -> None:
    """MoE runs: expert-load imbalance per layer (max expert load x experts; 1 = balanced) over training."""
    rows = [r for r in csv.DictReader(metrics.open()) if r.get("moe/imbalance_layer0")]
    if not rows:
        return
    layers = sorted(k for k in rows[0] if k.startswith("moe/imbalance_layer"))
    print("\n| MoE layer | imbalance, first logged step | mean of the last 10 logged steps | aux loss (last) |")
    print("|---|---|---|---|")
    for k in layers:
        tail = [float(r[k]) for r in rows[-10:]]
        aux = rows[-1].get("train/moe_aux") or ""
        aux = f"{float(aux):.3f}" if aux else "–"
        layer = k.removeprefix("moe/imbalance_layer")
        print(f"| {layer} | {float(rows[0][k]):.2f} | {sum(tail) / len(tail):.2f} | {aux} |")


if __name__ == "__main__":
    main()
