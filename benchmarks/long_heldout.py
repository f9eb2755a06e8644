"""A trained drafter's decoded acceptance on its recipe's held-out prompts, in the data curve's arm format.

    .venv/bin/python benchmarks/long_heldout.py --drafter outputs/smollm2_dspark_long/tb/version_0/drafter \\
        --heldout outputs/smollm2_dspark_long/data/responses_heldout.jsonl --samples 2400 --epochs 10
                                                                                              (make long-heldout)

Decodes the first ``--per_set`` held-out prompts per set (data-curve's fixed order) one at a time, T = 0, static
γ = ``--gamma``, ``--max_new_tokens`` new tokens, and writes ``<out>/heldout.json``: ``{"arm", "steps", "info",
"counts": {set: [{rounds, tokens, first}, ...]}}`` (what ``make data-curve`` writes per arm, so the data curve's
table and fit read it), with the command, CPU, commit and date. Prints τ and A_1 per set with a 95 % bootstrap
interval over prompts, and beside each an earlier arm's (``--compare``) when given. Acceptance only: no timing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dspark_lightning.atomic import atomic_write  # noqa: E402
from dspark_lightning.checkpoint import load_target_and_drafters  # noqa: E402
from dspark_lightning.devices import cpu_model  # noqa: E402
from dspark_lightning.eval import data_curve as dc  # noqa: E402


def interval(res: dc.ArmResult, metric: str, s: str, boot: int = 1000) -> tuple[float, float]:
    rng = np.random.default_rng(0)
    size = len(res.counts[s])
    ys = [res.metric(metric, s, rng.integers(0, size, size)) for _ in range(boot)]
    lo, hi = np.percentile(ys, [2.5, 97.5])
    return float(lo), float(hi)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--heldout", required=True, help="the recipe's <work_dir>/responses_heldout.jsonl")
    ap.add_argument("--samples", type=int, required=True, help="training conversations (the arm's name)")
    ap.add_argument("--epochs", type=float, required=True)
    ap.add_argument("--per_set", type=int, default=30)
    ap.add_argument("--gamma", type=int, default=7)
    ap.add_argument("--max_new_tokens", type=int, default=96)
    ap.add_argument("--compare", default=None, help="an earlier arm's JSON (data-curve format) to print beside")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/data/long"))
    a = ap.parse_args()

    from tqdm.auto import tqdm

    prompts = dc.heldout_prompts(a.heldout, a.per_set)
    target, (drafter,) = load_target_and_drafters(None, [a.drafter])
    stats = json.loads((Path(a.drafter).parent / "fit_stats.json").read_text())
    steps = int(stats["steps"])
    bar = tqdm(total=sum(len(ps) for ps in prompts.values()), desc="decode", unit="prompt")
    counts = {s: dc.decode_counts(target, drafter, ps, gamma=a.gamma, max_new_tokens=a.max_new_tokens, progress=bar)
              for s, ps in prompts.items()}  # fmt: skip
    bar.close()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    info = {"command": " ".join(["benchmarks/long_heldout.py", *sys.argv[1:]]), "cpu": cpu_model(),
            "commit": commit.strip(), "date": datetime.date.today().isoformat(), "drafter": a.drafter,
            "gamma": a.gamma, "max_new_tokens": a.max_new_tokens, "temperature": 0.0}  # fmt: skip
    res = dc.ArmResult(dc.Arm(a.samples, a.epochs), steps, counts, info)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "heldout.json", json.dumps(res.to_json(), indent=1) + "\n")
    old = dc.ArmResult.from_json(json.loads(Path(a.compare).read_text())) if a.compare else None
    for metric in ("tau", "A_1"):
        for s in counts:
            lo, hi = interval(res, metric, s)
            line = f"{metric} {s}: {res.metric(metric, s):.3f} [{lo:.2f}, {hi:.2f}]"
            if old is not None and s in old.counts:
                olo, ohi = interval(old, metric, s)
                line += f"   (compare: {old.metric(metric, s):.3f} [{olo:.2f}, {ohi:.2f}])"
            print(line)
    print(f"-> {out / 'heldout.json'}")


if __name__ == "__main__":
    main()
