"""Decoding throughput on this machine: decode() with a drafter vs plain decode() vs HF generate().

    python scripts/bench_decode.py --drafter outputs/smollm2_dspark/tb/version_0/drafter \
        --sps docs/data/sps_smollm2_cpu.json --out docs/data/decode_bench

Same target (the drafter's), same held-out prompts (dspark_lightning.eval.prompts), same chat template,
same output cap, one process; T = 0 and T = 1, batch 1 and 8. Writes <out>.json and <out>.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from dspark_lightning import load_drafter, load_target
from dspark_lightning.eval import eval_prompts, hf_generate
from dspark_lightning.eval.runner import run_decode
from dspark_lightning.export import read_config
from dspark_lightning.infer import SPSTable, decode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--sps", default=None, help="SPS table for hardware_aware (default: cached profile)")
    ap.add_argument("--per_domain", type=int, default=3)
    ap.add_argument("--max_new_tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="docs/data/decode_bench")
    ap.add_argument("--layout_study", action="store_true", help="only compare the padded and flat cache layouts")
    a = ap.parse_args()

    meta = read_config(a.drafter)["target"]
    target = load_target(meta["name"])
    drafter = load_drafter(a.drafter, target, dtype="auto")
    records = [r for d in ("math", "code", "chat") for r in eval_prompts(d, a.per_domain)]
    prompts = [target.render_prompt([{"role": "user", "content": r.turns[0]}]) for r in records]
    g = drafter.block_size
    hw = hardware_aware_spec(a)
    if a.layout_study:
        return layout_study(target, drafter, prompts, a)
    engines = {
        "HF generate": None,
        "plain decode()": (None, "static"),
        f"DSpark static γ={g}": (drafter, "static"),
        "DSpark hardware_aware": (drafter, hw),
    }
    rows = []
    for T in (0.0, 1.0):
        for batch in (1, 8):
            for name, spec in engines.items():
                t0 = time.perf_counter()
                if spec is None:
                    r = hf_generate(target, prompts, a.max_new_tokens, temperature=T, batch_size=batch, seed=a.seed)
                else:
                    r = run_decode(
                        target,
                        spec[0],
                        prompts,
                        temperature=T,
                        batch_size=batch,
                        scheduler=spec[1],
                        max_new_tokens=a.max_new_tokens,
                        seed=a.seed,
                    )
                r.update(engine=name, temperature=T, batch=batch, tok_s=r["generated_tokens"] / r["time_s"])
                rows.append(r)
                print(
                    f"T={T} batch={batch} {name:24s} {r['tok_s']:7.2f} tok/s  tau={r.get('tau')}  "
                    f"({time.perf_counter() - t0:.0f}s)",
                    flush=True,
                )
    greedy_b1 = [r for r in rows if r["temperature"] == 0.0 and r["batch"] == 1]
    ref = greedy_b1[0]["token_ids"]
    for r in greedy_b1[1:]:
        r["equals_hf_greedy"] = r["token_ids"] == ref
    info = {
        "target": meta["name"],
        "drafter": a.drafter,
        "block_size": g,
        "prompts": len(prompts),
        "per_domain": a.per_domain,
        "max_new_tokens": a.max_new_tokens,
        "threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
    }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"info": info, "rows": rows}, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(rows, g) + "\n")
    print(markdown(rows, g))


def hardware_aware_spec(a):
    """The hardware_aware scheduler with the given SPS table (or the cached profile)."""
    return {"name": "hardware_aware", "sps": SPSTable.load(a.sps)} if a.sps else "hardware_aware"


def layout_study(target, drafter, prompts, a) -> None:
    """Greedy, batch 8: the same decode with both cache layouts, alternated twice (drift cancels)."""
    rows = []
    hw = hardware_aware_spec(a)  # one table for every run
    for rep in range(2):
        runs = (
            ("plain", None, "static"),
            (f"DSpark static γ={drafter.block_size}", drafter, "static"),
            ("DSpark hardware_aware", drafter, hw),
        )
        for name, d, sched in runs:
            for layout in ("padded", "flat") if rep == 0 else ("flat", "padded"):
                res = decode(
                    target, d, prompts, max_new_tokens=a.max_new_tokens, scheduler=sched, batch_size=8, layout=layout
                )
                s = res.stats
                rows.append(
                    {
                        "engine": name,
                        "layout": layout,
                        "rep": rep,
                        "tok_s": s.tokens_per_s,
                        "verify_s": s.time_s["verify"],
                        "draft_s": s.time_s["draft"],
                        "tau": s.tau,
                        "mean_verify_len": s.mean_verify_len,
                        "mean_step_tokens": s.mean_step_tokens,
                    }
                )
                print(rows[-1], flush=True)
    lines = ["| engine | layout | tok/s (2 runs) | verify s | draft s | mean ℓ |", "|---|---|---|---|---|---|"]
    for name in dict.fromkeys(r["engine"] for r in rows):
        for layout in ("padded", "flat"):
            rs = [r for r in rows if r["engine"] == name and r["layout"] == layout]
            tok = " / ".join(f"{r['tok_s']:.2f}" for r in rs)
            v = sum(r["verify_s"] for r in rs) / len(rs)
            d = sum(r["draft_s"] for r in rs) / len(rs)
            ell = sum(r["mean_verify_len"] for r in rs) / len(rs)
            lines.append(f"| {name} | {layout} | {tok} | {v:.1f} | {d:.1f} | {ell:.2f} |")
    out = Path(a.out + "_layout")
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _f(v, spec: str) -> str:
    return "–" if v is None else format(v, spec)


def markdown(rows, g) -> str:
    head = "| T | batch | engine | tok/s | vs HF | τ | α | mean ℓ | greedy = HF |"
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        base = next(x for x in rows if x["temperature"] == r["temperature"] and x["batch"] == r["batch"])
        eq = {True: "yes", False: "NO"}.get(r.get("equals_hf_greedy"), "")
        cells = [
            f"{r['temperature']:g}",
            str(r["batch"]),
            r["engine"],
            f"{r['tok_s']:.2f}",
            f"{r['tok_s'] / base['tok_s']:.2f}×",
            _f(r.get("tau"), ".3f"),
            _f(r.get("acceptance_rate"), ".3f"),
            _f(r.get("mean_verify_len"), ".2f"),
            eq,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Per-position acceptance (k = 1..{g}): unconditional survival S_k, conditional A_k", ""]
    lines += ["| T | batch | engine | S_k | A_k |", "|---|---|---|---|---|"]
    for r in rows:
        if r.get("tau") is None:
            continue
        s = " ".join(_f(v, ".2f") for v in r["survival"])
        c = " ".join(_f(v, ".2f") for v in r["conditional_acceptance"])
        lines.append(f"| {r['temperature']:g} | {r['batch']} | {r['engine']} | {s} | {c} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
