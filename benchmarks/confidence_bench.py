"""How well a drafter's confidences rank and how well its calibration holds, per position, at T = 0 and T = 1.

    .venv/bin/python benchmarks/confidence_bench.py --drafter outputs/smollm2_dspark/tb/version_0/drafter \\
        --heldout outputs/smollm2_dspark/data/responses_heldout.jsonl --label make_run      (make confidence-bench)

Per temperature: ``dspark-lightning calibrate`` on the recipe's own held-out split (the default pool of ``fit``'s
calibration; half its prompts fit the maps, the other half score them), then the same drafter decoded with full
blocks on the built-in evaluation prompts (a distribution the calibration never saw), scored with the map just
fitted. Writes ``<out>/confidence.json`` with rows ``{drafter, T, pool, position, auroc_head, auroc_margin, auroc,
ece_raw, ece_sts, ece_calibrated, ece_floor, calibration, rows}`` and the replayed frontiers of static and threshold
policies; the calibration reports and reliability diagrams go to ``<out>/<label>_T<T>/``. Leaves the calibration
files in the drafter folder (that is what ``decode()`` then reads).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
from dataclasses import asdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from dspark_lightning.atomic import atomic_write  # noqa: E402
from dspark_lightning.calibration import Rollouts, calibrate, rollouts  # noqa: E402
from dspark_lightning.calibration.confidence import frontier, report  # noqa: E402
from dspark_lightning.checkpoint import load_target_and_drafters  # noqa: E402
from dspark_lightning.checkpoint.calibration import ConfidenceMap  # noqa: E402
from dspark_lightning.data.prompts.evalsets import eval_prompts  # noqa: E402
from dspark_lightning.devices import cpu_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
KEYS = ("position", "rows", "mean_y", "mean_p", "auroc_head", "auroc_margin", "auroc", "ece_raw", "ece_sts",
        "ece_calibrated", "ece_floor", "brier_raw", "brier_calibrated", "calibration")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--label", required=True)
    ap.add_argument("--heldout", required=True, help="the recipe's <work_dir>/responses_heldout.jsonl")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--acceptance", default="rejection", help="the mode the T > 0 rounds are decoded under (coupled: "
                    "maps fitted on coupled rounds, calibration_T<T>_coupled.json)")  # fmt: skip
    ap.add_argument("--prompts_per_domain", type=int, default=32)
    ap.add_argument("--builtin_per_domain", type=int, default=8)
    ap.add_argument("--max_new_tokens", type=int, default=128)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/data/confidence"))
    a = ap.parse_args()

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "confidence.json"
    old = json.loads(path.read_text()) if path.is_file() else {}
    mode = a.acceptance

    def redo(r):  # this run's rows replace the same drafter's rows under the same acceptance mode
        return r["drafter"] == a.label and r.get("acceptance", "rejection") == mode

    rows = [r for r in old.get("rows", []) if not redo(r)]
    frontiers = [f for f in old.get("frontiers", []) if not redo(f)]
    builtin = [r.turns[0] for dom in ("math", "code", "chat") for r in eval_prompts(dom, a.builtin_per_domain)]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    made = {
        "commit": commit.strip(),
        "date": datetime.date.today().isoformat(),
        "cpu": cpu_model(),
        "prompts_per_domain": a.prompts_per_domain,
        "acceptance": mode,
    }  # each row says what produced it (labels are rerun apart)
    for T in a.temperatures:
        if mode != "rejection" and T == 0:
            continue  # greedy acceptance is the same in every mode
        report_dir = out / f"{a.label}_T{T:g}" if mode == "rejection" else out / f"{a.label}_T{T:g}_{mode}"
        cal = calibrate(a.drafter, temperature=T, prompts=a.heldout, prompts_per_domain=a.prompts_per_domain,
                        max_new_tokens=a.max_new_tokens, report_dir=report_dir, acceptance=mode,
                        quiet=False)  # fmt: skip
        doc = json.loads(cal.read_text())
        for r in doc["confidence_report"]:
            rows.append({"drafter": a.label, "T": T, "pool": "recipe held-out", **{k: r[k] for k in KEYS}, **made})
        frontiers.append({"drafter": a.label, "T": T, "pool": "recipe held-out", "acceptance": mode,
                          "points": doc["frontier"]})  # fmt: skip
        target, (drafter,) = load_target_and_drafters(None, [a.drafter])
        ro = rollouts(target, drafter, builtin, temperature=T, max_new_tokens=a.max_new_tokens, acceptance=mode,
                      progress=True)  # fmt: skip
        scored = ro.confidence_rows(torch.ones(len(ro.m), dtype=torch.bool))
        cmap = ConfidenceMap.from_dict(doc["confidence"])
        pool = Rollouts.load(report_dir / "rollouts.pt")  # the comparators (STS, margin) fitted on the whole pool
        fit_rows = pool.confidence_rows(torch.ones(len(pool.m), dtype=torch.bool))
        for r in report(scored, cmap, doc["confidence_methods"], fit=fit_rows):
            rows.append({"drafter": a.label, "T": T, "pool": "built-in eval sets", **{k: asdict(r)[k] for k in KEYS},
                         **made})  # fmt: skip
        frontiers.append({"drafter": a.label, "T": T, "pool": "built-in eval sets", "acceptance": mode,
                          "points": frontier(scored, cmap)})  # fmt: skip
        for r in rows[-len(doc["confidence_report"]) :]:
            print(json.dumps(r), flush=True)
    doc = {
        "command": f"benchmarks/confidence_bench.py --drafter {a.drafter} --label {a.label} --heldout {a.heldout}"
        + ("" if mode == "rejection" else f" --temperatures 1 --acceptance {mode}"),
        **made,
        "rows": rows,
        "frontiers": frontiers,
    }
    atomic_write(path, json.dumps(doc, indent=1) + "\n")
    print(f"-> {path}")


if __name__ == "__main__":
    main()
