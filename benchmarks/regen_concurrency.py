"""Regeneration throughput against concurrency on a recipe's own training prompts (our engine, the recipe's
regeneration precision, features captured as the recipe says).

    python benchmarks/regen_concurrency.py --prompts 256 --concurrency 48 96 192 \
        --out benchmarks/results/data/regen_concurrency                             # (make regen-concurrency)

Each setting answers the same first ``--prompts`` training prompts of ``--recipe``; the table gives new tokens/s and
where the engine's time went (prompt prefill, decode steps). Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from dspark_lightning.cli.prepare import check_cache, parse_recipe
from dspark_lightning.data.regen.regen_engine import EngineRegenerator
from dspark_lightning.data.regen.regenerate import generation_settings
from dspark_lightning.devices import cpu_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="recipes/smollm2_dspark.yaml")
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[48, 96, 192])
    ap.add_argument("--out", default="benchmarks/results/data/regen_concurrency")
    a = ap.parse_args()
    dm, _ = parse_recipe("prepare", ["--config", a.recipe], check_cache)
    job = dm.prepare_job(progress=False)
    recs = job.prompts["train"][: a.prompts]
    target = job.load_regen_target() if job.load_regen_target is not None else job.load_target()
    cfg = generation_settings(target, seed=job.seed, **job.regen.settings())
    rows = []
    for conc in a.concurrency:
        regen = EngineRegenerator(target, cfg, concurrency=conc, capture=job.regen.capture_features)
        t0 = time.perf_counter()
        _, tokens, _ = regen.answer(recs)
        wall = time.perf_counter() - t0
        ts = regen.engine.time_s
        rows.append({"concurrency": conc, "new_tokens": tokens, "prompt_tokens": regen.prompt_tokens,
                     "wall_s": round(wall, 1), "new_tok_s": round(tokens / wall, 1),
                     "prefill_s": round(ts["prefill"], 1), "decode_s": round(ts["verify"], 1),
                     "decode_tok_s": round(tokens / max(ts["verify"], 1e-9), 1)})  # fmt: skip
        print(rows[-1], flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    info = {"recipe": a.recipe, "prompts": len(recs), "dtype": str(next(target.parameters()).dtype),
            "cpu": cpu_model(), "threads": torch.get_num_threads(), "commit": commit,
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}  # fmt: skip
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "regen_concurrency.json").write_text(json.dumps({"info": info, "rows": rows}, indent=2) + "\n")
    lines = [f"Regeneration of {len(recs)} training prompts of {a.recipe} ({info['dtype']}), {info['cpu']}, "
             f"{info['threads']} threads, commit {commit}, {info['date']}", "",
             "| concurrency | new tokens | prompt tokens | wall s | new tok/s | prefill s | decode s | decode tok/s |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append("| " + " | ".join(str(r[k]) for k in ("concurrency", "new_tokens", "prompt_tokens", "wall_s",
                     "new_tok_s", "prefill_s", "decode_s", "decode_tok_s")) + " |")  # fmt: skip
    (out / "regen_concurrency.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
