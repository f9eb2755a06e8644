"""Servable options against the ones no server loads, at equal budget, decoded (docs/serving.md, "What serving costs").

Each cell of benchmarks/servable_cells.yaml is recipes/smollm2_dspark.yaml with the cell's overrides, trained for the
same wall budget (benchmarks/matrix.py, data included on first use), then decoded on the built-in eval prompts
(benchmarks/acceptance_probe.py: static γ = 7, T = 0, batch 1, 10 prompts per set). Run alone on the machine.

    python benchmarks/servable.py --minutes 7 --out benchmarks/results/data/servable          (make servable-cells)
    python benchmarks/servable.py --report --out benchmarks/results/data/servable              (the table only)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import matrix  # noqa: E402
from decoded_fit import probe  # noqa: E402


def table(out: Path) -> str:
    info = json.loads((out / "run_info.json").read_text())
    lines = [
        f"Measured {info['date']} on {info['cpu']} ({info['cores']} cores), commit {info['commit']}; "
        f"{info['minutes']:g} training minutes per cell, decoded at static γ = 7, T = 0, batch 1, "
        f"{info['prompts_per_domain']} eval prompts per set.",
        "",
        "| cell | what | steps/s | anchors seen | TF-A_1 held-out | A_1 math | A_1 code | A_1 chat | τ math | τ code "
        "| τ chat |",
        "|" + "---|" * 11,
    ]
    for cell in info["cells"]:
        p = out / f"{cell}-{info['minutes']:g}m.json"
        d = out / "probe" / cell / "decoded.json"
        if not (p.is_file() and d.is_file()):
            continue
        r, s = json.loads(p.read_text()), json.loads(d.read_text())
        tfa = r["validation"].get("all", {}).get("tfa_pos", [float("nan")])[0]
        a1 = [s.get(k, {}).get("A_1", float("nan")) for k in ("math", "code", "chat")]
        tau = [s.get(k, {}).get("tau", float("nan")) for k in ("math", "code", "chat")]
        lines.append(
            f"| {cell} | {r['what']} | {r['steps_per_s']:.2f} | {r.get('anchors_seen') or 0:,} | {tfa:.3f} | "
            + " | ".join(f"{x:.2f}" for x in a1)
            + " | "
            + " | ".join(f"{x:.2f}" for x in tau)
            + " |"
        )
    text = "\n".join(lines) + "\n"
    (out / "servable.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default=str(ROOT / "recipes/smollm2_dspark.yaml"))
    ap.add_argument("--cells", default=str(ROOT / "benchmarks/servable_cells.yaml"))
    ap.add_argument("--minutes", type=float, default=7.0)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--prompts_per_domain", type=int, default=10)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/data/servable"))
    ap.add_argument("--report", action="store_true")
    a = ap.parse_args(argv)
    out = Path(a.out)
    if a.report:
        print(table(out))
        return
    base = yaml.safe_load(Path(a.base).read_text())
    base.pop("export", None)  # research cells: no serving export
    cells = [c for c in yaml.safe_load(Path(a.cells).read_text()) if a.only is None or c["name"] in a.only]
    out.mkdir(parents=True, exist_ok=True)
    info = {"date": time.strftime("%Y-%m-%d"), "cpu": matrix.cpu_model(), "cores": os.cpu_count(),
            "commit": matrix.commit(), "minutes": a.minutes, "prompts_per_domain": a.prompts_per_domain,
            "cells": [c["name"] for c in cells]}  # fmt: skip
    (out / "run_info.json").write_text(json.dumps(info, indent=2) + "\n")
    for cell in cells:
        print(f"[servable] {cell['name']}: training {a.minutes:g} min ...", flush=True)
        row = matrix.run_cell(base, cell, a.minutes, out)
        print(f"[servable] {cell['name']}: decoding the eval prompts ...", flush=True)
        sets = probe(str(ROOT / row["drafter"]), out / "probe" / cell["name"], a.prompts_per_domain)
        (out / "probe" / cell["name"] / "decoded.json").write_text(json.dumps(sets, indent=2) + "\n")
        print(table(out), flush=True)


if __name__ == "__main__":
    main()
