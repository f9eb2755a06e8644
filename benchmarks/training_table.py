"""Training budget and held-out τ̂ of finished `fit` runs, as a Markdown table (benchmarks/results/results_log.md §5.2).

    python benchmarks/training_table.py outputs/compare/{dspark,dflash,eagle3,mtp1} \
        --out benchmarks/results/data/compare_training

For each run directory (a recipe's default_root_dir): optimizer steps, tokens seen, training wall time, whole-command
wall time and peak RSS (from time.log, if present), trainable parameters, and the teacher-forced held-out τ̂ at T = 1
(1 + Σ_k Π_{i<=k} c*_i, c* = Σ min(p_target, q_draft)) at every validation (step 0, mid-training, end).
"""

from __future__ import annotations

import argparse
import csv
import json
import re
from pathlib import Path

from dspark_lightning.data.prompts.sources import DOMAINS


def _pos(k: str) -> int:
    return int(k.removeprefix("val/acc_pos"))


def read_run(run: str | Path) -> dict | None:
    """Budget and validation history of one run directory (None if it has not finished)."""
    run = Path(run)
    metrics = run / "csv" / "version_0" / "metrics.csv"
    stats = run / "tb" / "version_0" / "fit_stats.json"
    if not metrics.is_file() or not stats.is_file():
        return None
    vals = [r for r in csv.DictReader(metrics.open()) if r.get("val/tau_hat")]
    history = []
    for r in vals:
        h = {"step": int(r["step"]), "tau_hat": float(r["val/tau_hat"])}
        h |= {d: float(r[f"val/tau_hat_{d}"]) for d in DOMAINS if r.get(f"val/tau_hat_{d}")}
        pos = sorted((k for k in r if k.startswith("val/acc_pos") and r[k]), key=_pos)
        h["acc_pos"] = [float(r[k]) for k in pos]
        history.append(h)
    out = {"run": str(run), **history[-1], "history": history}
    out |= {k: v for k, v in json.loads(stats.read_text()).items() if k in ("steps", "tokens", "wall_s")}
    cfg = run / "tb" / "version_0" / "drafter" / "config.json"
    if cfg.is_file():
        out["block_size"] = json.loads(cfg.read_text())["block_size"]
    st = run / "tb" / "version_0" / "drafter" / "model.safetensors"
    if st.is_file():
        from safetensors import safe_open

        with safe_open(str(st), "pt") as f:
            out["params"] = sum(_numel(f.get_slice(k).get_shape()) for k in f.keys())
    tl = run / "time.log"
    if tl.is_file():
        text = tl.read_text()
        m = re.search(r"Elapsed \(wall clock\) time.*: ([\d:.]+)", text)
        rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
        if m:
            parts = [float(p) for p in m.group(1).split(":")]
            out["command_wall_s"] = sum(p * 60**i for i, p in enumerate(reversed(parts)))
        if rss:
            out["peak_rss_mib"] = int(rss.group(1)) / 1024
    return out


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def markdown(runs: dict[str, dict]) -> str:
    head = ["drafter", "γ", "params", "steps", "tokens", "train s", "peak RSS MiB", "τ̂ start → mid → end"]
    head += [f"τ̂ {d}" for d in DOMAINS] + ["c*_1 .. c*_γ (end)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in runs.items():
        hist = " → ".join(f"{h['tau_hat']:.3f}" for h in r["history"])
        cells = [
            name,
            str(r.get("block_size", "–")),
            f"{r['params'] / 1e6:.1f} M" if "params" in r else "–",
            str(r["steps"]),
            f"{r['tokens']:,}",
            f"{r['wall_s']:.0f}",
            f"{r['peak_rss_mib']:.0f}" if "peak_rss_mib" in r else "–",
            hist,
            *(f"{r[d]:.3f}" if d in r else "–" for d in DOMAINS),
            " ".join(f"{a:.2f}" for a in r["acc_pos"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="run directories; the table names each by its last path component")
    ap.add_argument("--out", default=None, help="write <out>.json and <out>.md")
    a = ap.parse_args()
    runs = {Path(r).name: read_run(r) for r in a.runs}
    missing = [n for n, r in runs.items() if r is None]
    if missing:
        raise SystemExit(f"unfinished runs (no metrics or fit_stats): {missing}")
    md = markdown(runs)
    print(md)
    if a.out:
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(runs, indent=1) + "\n")
        out.with_suffix(".md").write_text(md + "\n")


if __name__ == "__main__":
    main()
