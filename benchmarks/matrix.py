"""The experiment matrix (benchmarks/results/matrix.md): fixed wall-clock training cells on shared prepared data.

Each cell is the base recipe plus the cell's overrides (a nested dict merged into the YAML), trained for a fixed
wall-clock budget (trainer.max_time with the LR schedule read against the same budget), then validated once on the
held-out split. Reported per cell: TF-A_1..4 at T = 0 (teacher-forced argmax agreement), c*_1, τ̂ (T = 1) and the
greedy τ̂, steps/s, anchors seen, wall and CPU minutes. Run alone on the machine (two cores).

    dspark-lightning prepare --config recipes/matrix/base.yaml         # once: the shared data
    python benchmarks/matrix.py --cells benchmarks/matrix_cells.yaml --minutes 6 --out benchmarks/results/data/matrix \
        [--only a b]
    python benchmarks/matrix.py --report benchmarks/results/data/matrix     # the table and the budget plot only
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import yaml

from dspark_lightning.devices import cpu_model

ROOT = Path(__file__).resolve().parents[1]


def merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def commit() -> str:
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return r.stdout.strip() or "unknown"


def cell_recipe(base: dict, cell: dict, minutes: float, run_dir: Path) -> dict:
    r = merge(base, cell.get("overrides", {}))
    r["trainer"]["default_root_dir"] = str(run_dir)
    r["trainer"]["max_time"] = {"seconds": int(minutes * 60)}
    r["trainer"]["logger"] = [
        {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(run_dir), "name": "csv"}}
    ]
    r["model"].setdefault("optim", {})["time_budget_s"] = minutes * 60
    return r


def run_cell(base: dict, cell: dict, minutes: float, out: Path) -> dict:
    name = cell["name"]
    run_dir = ROOT / "outputs" / "matrix" / "runs" / f"{name}-{minutes:g}m"
    if run_dir.exists():
        subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    run_dir.mkdir(parents=True)
    recipe = run_dir / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(cell_recipe(base, cell, minutes, run_dir), sort_keys=False))
    cmd = [sys.executable, "-m", "dspark_lightning.cli.fit", "fit", "--config", str(recipe),
           "--validate_before_fit", "false", "--export.dir", str(run_dir / "drafter")]  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with open(run_dir / "fit.log", "w") as log:
        rc = subprocess.run(
            cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"}
        )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if rc.returncode != 0:
        raise SystemExit(f"cell {name} failed (exit {rc.returncode}); see {run_dir / 'fit.log'}")
    stats = json.loads(next(run_dir.glob("csv/version_*/fit_stats.json")).read_text())
    val = stats["validation"]
    row = {
        "name": name,
        "item": cell.get("item", ""),
        "what": cell.get("what", ""),
        "minutes": minutes,
        "steps": stats["steps"],
        "steps_per_s": stats["steps"] / stats["wall_s"],
        "train_wall_s": stats["wall_s"],
        "process_wall_s": wall,
        "cpu_min": (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / 60,
        "anchors_seen": stats.get("anchors_seen"),
        "block_rows_seen": stats.get("block_rows_seen"),
        "validation": val,
        "drafter": str(run_dir.relative_to(ROOT) / "drafter"),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}-{minutes:g}m.json").write_text(json.dumps(row, indent=2) + "\n")
    return row


def fmt_row(r: dict) -> str:
    a = r["validation"].get("all", {})
    tfa, acc = (a.get("tfa_pos", []) + [math.nan] * 4)[:4], a.get("acc_pos", [math.nan])  # MTP-1 has one slot
    dom = {d: r["validation"].get(d, {}).get("tfa_pos", [math.nan])[0] for d in ("math", "code", "chat")}
    cells = [r["name"], r.get("item", ""), f"{r['minutes']:g}", *[f"{x:.3f}" for x in tfa[:4]],
             *[f"{dom[d]:.3f}" for d in ("math", "code", "chat")], f"{acc[0]:.3f}", f"{a.get('tau_hat', math.nan):.3f}",
             f"{a.get('tau_greedy', math.nan):.3f}", f"{r['steps_per_s']:.2f}", str(r["steps"]),
             f"{r.get('anchors_seen') or 0:,}", f"{r['train_wall_s'] / 60:.1f}", f"{r['cpu_min']:.1f}"]  # fmt: skip
    return "| " + " | ".join(cells) + " |"


HEADER = (
    "| cell | item | budget min | TF-A_1 | TF-A_2 | TF-A_3 | TF-A_4 | TF-A_1 math | TF-A_1 code | TF-A_1 chat | c*_1 "
    "| τ̂ (T=1) | τ̂ (T=0) | steps/s | steps | anchors seen | train wall min | CPU min |\n"
    "|" + "---|" * 18
)


def report(out: Path, info: dict | None = None) -> str:
    skip = {"run_info.json", "budget_fit.json"}
    rows = [json.loads(p.read_text()) for p in sorted(out.glob("*.json")) if p.name not in skip]
    rows.sort(key=lambda r: (r.get("order", 0), r["name"], r["minutes"]))
    info = info or (json.loads((out / "run_info.json").read_text()) if (out / "run_info.json").exists() else {})
    where = f"{info.get('cpu', '?')} ({info.get('cores', '?')} cores), commit {info.get('commit', '?')}"
    lines = [f"Measured {info.get('date', '?')} on {where}; held-out split of recipes/matrix/base.yaml.", "", HEADER]
    lines += [fmt_row(r) for r in rows]
    text = "\n".join(lines) + "\n"
    (out / "matrix.md").write_text(text)
    plot_budget(rows, out)
    return text


def plot_budget(rows: list[dict], out: Path) -> None:
    """TF-A_1 against log(anchors seen) for the cells run at several budgets, with a least-squares line each."""
    by = {}
    for r in rows:
        if r.get("anchors_seen"):
            by.setdefault(r["name"], []).append(r)
    series = {k: sorted(v, key=lambda r: r["anchors_seen"]) for k, v in by.items() if len(v) >= 2}
    if not series:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(6.5, 4))
    fits = {}
    for name, rs in series.items():
        x = np.log10([r["anchors_seen"] for r in rs])
        for dom, mk in (("all", "o"), ("math", "^"), ("code", "s")):
            y = [r["validation"].get(dom, {}).get("tfa_pos", [np.nan])[0] for r in rs]
            ax.plot(x, y, mk + "-", label=f"{name} {dom}")
            if dom != "chat" and not np.isnan(y).any():
                slope, icpt = np.polyfit(x, y, 1)
                fits[f"{name}/{dom}"] = {"slope_per_decade": float(slope), "intercept": float(icpt)}
    ax.set_xlabel("log10(anchor blocks seen)")
    ax.set_ylabel("TF-A_1 (T = 0, held-out)")
    ax.axhline(0.65, ls=":", c="gray")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "budget_fit.png", dpi=120)
    (out / "budget_fit.json").write_text(json.dumps(fits, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default=str(ROOT / "recipes/matrix/base.yaml"))
    ap.add_argument("--cells", default=str(ROOT / "benchmarks/matrix_cells.yaml"))
    ap.add_argument("--minutes", type=float, nargs="+", default=[6.0])
    ap.add_argument("--only", nargs="*", default=None, help="cell names to run (default: all)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/data/matrix"))
    ap.add_argument("--report", action="store_true", help="only rebuild the table and plot from --out")
    a = ap.parse_args()
    out = Path(a.out)
    if a.report:
        print(report(out))
        return
    base = yaml.safe_load(Path(a.base).read_text())
    cells = yaml.safe_load(Path(a.cells).read_text())
    known = {c["name"] for c in cells}
    unknown = set(a.only or []) - known
    if unknown:
        raise SystemExit(f"unknown cells {sorted(unknown)}; known: {sorted(known)}")
    out.mkdir(parents=True, exist_ok=True)
    info = {"date": time.strftime("%Y-%m-%d"), "cpu": cpu_model(), "cores": os.cpu_count(), "commit": commit()}
    (out / "run_info.json").write_text(json.dumps(info, indent=2) + "\n")
    for order, cell in enumerate(cells):
        if a.only is not None and cell["name"] not in a.only:
            continue
        for m in a.minutes:
            print(f"[matrix] {cell['name']} ({m:g} min) ...", flush=True)
            row = run_cell(base, cell, m, out)
            row["order"] = order
            (out / f"{cell['name']}-{m:g}m.json").write_text(json.dumps(row, indent=2) + "\n")
            print(fmt_row(row), flush=True)
    print(report(out, info))


if __name__ == "__main__":
    main()
