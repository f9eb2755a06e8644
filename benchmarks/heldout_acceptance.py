"""Decode any trained drafter the way `dspark-lightning data-curve` decodes its arms, so it sits in the same table.

T = 0, static γ, batch 1, the first ``--per_set`` prompts per set (math / code / chat) of a recipe's held-out
responses in data-curve's fixed order; τ and A_1 with a 95 % bootstrap interval over prompts.

    python benchmarks/heldout_acceptance.py --drafter outputs/smollm2_dspark/.../drafter \\
        --heldout outputs/data_curve/data/responses_heldout.jsonl --samples 1175 --epochs 2.3 --steps 663 \\
        --out benchmarks/results/data/data_curve/make_run.json

``--samples`` / ``--epochs`` / ``--steps`` label the row (what the drafter was trained on). Writes the arm JSON
(data-curve's format) and prints its table row.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from dspark_lightning.checkpoint import load_target_and_drafters  # noqa: E402
from dspark_lightning.devices import cpu_model  # noqa: E402
from dspark_lightning.eval import data_curve as dc  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--heldout", required=True, help="a recipe's responses_heldout.jsonl")
    ap.add_argument("--per_set", type=int, default=30)
    ap.add_argument("--gamma", type=int, default=7)
    ap.add_argument("--max_new_tokens", type=int, default=96)
    ap.add_argument("--samples", type=int, required=True)
    ap.add_argument("--epochs", type=float, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    target, (drafter,) = load_target_and_drafters(None, [a.drafter])
    prompts = dc.heldout_prompts(a.heldout, a.per_set)
    t0 = time.perf_counter()
    counts = {s: dc.decode_counts(target, drafter, ps, gamma=a.gamma, max_new_tokens=a.max_new_tokens)
              for s, ps in prompts.items()}  # fmt: skip
    info = {"drafter": a.drafter, "heldout": a.heldout, "cpu": cpu_model(), "gamma": a.gamma,
            "max_new_tokens": a.max_new_tokens, "decode_wall_s": round(time.perf_counter() - t0, 1),
            "date": time.strftime("%Y-%m-%d %H:%M")}  # fmt: skip
    res = dc.ArmResult(dc.Arm(a.samples, a.epochs), a.steps, counts, info)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res.to_json(), indent=1) + "\n")
    print(dc.arms_table([res]))


if __name__ == "__main__":
    main()
