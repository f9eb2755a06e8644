"""Per-position acceptance of a drafter with a fixed block (static scheduler, no draft gate) on the held-out sets.

The hardware-aware scheduler hides a weak drafter (it verifies few drafts or skips drafting); this shows what the
drafter itself achieves: τ, α and the conditional acceptance A_k at γ = 7 and 3, T = 0 and 1, batch 1.

    python scripts/acceptance_probe.py --drafter DIR --out docs/data/acceptance_probe
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from dspark_lightning import load_drafter, load_target
from dspark_lightning.eval.prompts import eval_prompts
from dspark_lightning.eval.runner import drafter_dtype_name, run_info
from dspark_lightning.infer import decode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--prompts_per_domain", type=int, default=3)
    ap.add_argument("--max_new_tokens", type=int, default=128)
    ap.add_argument("--gammas", type=int, nargs="+", default=[7, 3])
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    target = load_target(a.target)
    drafter = load_drafter(a.drafter, target, dtype="auto")
    rows = []
    for temp in a.temperatures:
        for dom in ("math", "code", "chat"):
            prompts = [r.turns[0] for r in eval_prompts(dom, a.prompts_per_domain)]
            for g in a.gammas:
                s = decode(
                    target,
                    drafter,
                    prompts,
                    max_new_tokens=a.max_new_tokens,
                    temperature=temp,
                    scheduler={"name": "static", "gamma": g},
                    batch_size=1,
                ).stats
                row = {
                    "T": temp,
                    "set": dom,
                    "gamma": g,
                    "tau": round(s.tau, 3),
                    "alpha": None if s.acceptance_rate is None else round(s.acceptance_rate, 3),
                    "A_k": [None if x is None else round(x, 2) for x in s.conditional_acceptance],
                    "tok_per_s": round(s.tokens_per_s, 2),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    info = {"run": run_info(target, drafter_dtype=drafter_dtype_name(drafter)), "drafter": a.drafter, "rows": rows}
    (out / "acceptance.json").write_text(json.dumps(info, indent=1) + "\n")
    lines = ["| T | set | γ | τ | α | A_1 | A_2 | A_3 | tok/s |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ak = (r["A_k"] + [None] * 3)[:3]
        lines.append(
            f"| {r['T']:g} | {r['set']} | {r['gamma']} | {r['tau']:.3f} | {r['alpha']} | "
            + " | ".join("–" if x is None else f"{x:.2f}" for x in ak)
            + f" | {r['tok_per_s']:.1f} |"
        )
    (out / "acceptance.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    torch.set_num_threads(min(2, torch.get_num_threads()))
    main()
