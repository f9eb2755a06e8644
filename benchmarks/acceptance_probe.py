"""Per-position acceptance of a drafter with a fixed block (static scheduler, no draft gate), γ x T, batch 1.

The hardware-aware scheduler hides a weak drafter (it verifies few drafts or skips drafting); this shows what the
drafter itself achieves: τ, α and the conditional acceptance A_k. A loop over

    dspark-lightning eval --drafter DIR --scheduler static:γ --temperature T --batch_size 1 --seed 0 ...

(one run per γ and T, each into <out>/runs/T<T>_g<γ>/) that gathers the drafter's rows into one table:

    python benchmarks/acceptance_probe.py --drafter DIR --out benchmarks/results/data/acceptance_probe
        # make acceptance: the long drafter into benchmarks/results/data/acceptance_long
    python benchmarks/acceptance_probe.py --drafter DIR --prompts WORK_DIR/responses_heldout.jsonl --out DIR

Writes <out>/acceptance.json (run info, one row per T x set x γ) and <out>/acceptance.md.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from dspark_lightning.cli import main as cli  # noqa: E402
from dspark_lightning.eval.runner import BUILTIN  # noqa: E402


def rows_of(run: Path, name: str, T: float, gamma: int) -> list[dict]:
    """One row per prompt set of an ``eval`` output directory (built-in sets named by their domain)."""
    doc = json.loads((run / "tau_table.json").read_text())
    acc = json.loads((run / "acceptance.json").read_text())
    out = []
    for d in doc["datasets"]:
        ds = d["name"]
        alpha = doc["acceptance_rate"][name][ds]
        out.append({
            "T": T, "set": BUILTIN.get(ds, ds), "gamma": gamma, "tau": round(doc["tau"][name][ds], 3),
            "alpha": None if alpha is None else round(alpha, 3),
            "A_k": [None if x is None else round(x, 2) for x in acc[name][ds]["conditional_acceptance"]],
            "tok_per_s": round(doc["tokens_per_s"][name][ds], 2),
        })  # fmt: skip
    return out


def markdown(rows: list[dict]) -> str:
    lines = ["| T | set | γ | τ | α | A_1 | A_2 | A_3 | tok/s |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ak = (r["A_k"] + [None] * 3)[:3]
        lines.append(
            f"| {r['T']:g} | {r['set']} | {r['gamma']} | {r['tau']:.3f} | {r['alpha']} | "
            + " | ".join("–" if x is None else f"{x:.2f}" for x in ak)
            + f" | {r['tok_per_s']:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--target", default=None, help="default: the drafter's own target (its layers and chat format)")
    ap.add_argument("--prompts_per_domain", type=int, default=3)
    ap.add_argument("--max_new_tokens", type=int, default=128)
    ap.add_argument("--gammas", type=int, nargs="+", default=[7, 3])
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--prompts", help="a responses JSONL instead of the evaluation sets (eval --prompts)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    out = Path(a.out)
    rows, info = [], None
    for T in a.temperatures:
        for g in a.gammas:
            run = out / "runs" / f"T{T:g}_g{g}"
            args = ["eval", "--drafter", f"probe={a.drafter}", *(["--target", a.target] if a.target else []),
                    "--scheduler", f"{{class_path: static, init_args: {{gamma: {g}}}}}", "--temperature", str(T),
                    "--batch_size", "1", "--seed", "0",
                    "--prompts_per_domain", str(a.prompts_per_domain), "--max_new_tokens", str(a.max_new_tokens),
                    "--out", str(run)]  # fmt: skip
            cli([*args, *(["--prompts", a.prompts] if a.prompts else [])])
            rows += rows_of(run, "probe", T, g)
            info = info or json.loads((run / "tau_table.json").read_text())["info"]
    order = list(dict.fromkeys(r["set"] for r in rows))
    rows.sort(key=lambda r: (a.temperatures.index(r["T"]), order.index(r["set"]), a.gammas.index(r["gamma"])))
    doc = {"run": info, "drafter": a.drafter, "rows": rows}
    (out / "acceptance.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / "acceptance.md").write_text(markdown(rows) + "\n")
    print(markdown(rows))


if __name__ == "__main__":
    main()
