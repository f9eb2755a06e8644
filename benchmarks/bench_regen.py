"""Regeneration throughput: our engine (continuous batching) against HF ``generate`` on the same prompts.

    python benchmarks/bench_regen.py --out docs/data/regen_bench          # (make bench-regen)

Both engines answer the same prompts (first user turn, the recipe's sampling settings) into fresh
JSONL files; the table gives generated tokens, wall time and tokens/s, and checks that the dspark
engine's responses do not depend on the concurrency (a second, smaller-concurrency run on a subset).
Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import torch

from dspark_lightning import load_target
from dspark_lightning.data.regenerate import regenerate
from dspark_lightning.data.sources import mixture


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max_new_tokens", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--hf_batch", type=int, default=24)
    ap.add_argument("--out", default="docs/data/regen_bench")
    a = ap.parse_args()
    target = load_target(a.target)
    sources = [{"name": "gsm_symbolic", "limit": a.prompts // 2}, {"name": "sharegpt", "limit": a.prompts // 2}]
    prompts = mixture(sources, "train", 0.0, 42)[: a.prompts]
    kw = {"max_new_tokens": a.max_new_tokens, "temperature": 0.2, "top_p": 0.9, "max_turns": 1, "seed": 42}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        runs = [("dspark", {"engine": "dspark", "concurrency": a.concurrency}),
                ("hf", {"engine": "hf", "batch_size": a.hf_batch})]  # fmt: skip
        for name, extra in runs:
            st = regenerate(target, prompts, Path(tmp) / f"{name}.jsonl", **kw, **extra)
            rows.append({"engine": name, **{k: st[k] for k in ("written", "tokens", "seconds", "tokens_per_s")}})
            print(rows[-1], flush=True)
        sub = prompts[: max(4, a.concurrency // 4)]
        regenerate(target, sub, Path(tmp) / "small.jsonl", **kw, engine="dspark", concurrency=3)
        big = {r["id"]: r["turns"] for r in _rows(Path(tmp) / "dspark.jsonl")}
        small = _rows(Path(tmp) / "small.jsonl")
        same = sum(big[r["id"]] == r["turns"] for r in small)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    info = {"target": a.target, "prompts": len(prompts), "max_new_tokens": a.max_new_tokens,
            "concurrency": a.concurrency, "hf_batch": a.hf_batch, "threads": torch.get_num_threads(),
            "cpu": platform.processor(), "commit": commit,
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "batching_invariance": f"{same}/{len(small)} identical at concurrency 3 and {a.concurrency}"}  # fmt: skip
    speed = rows[0]["tokens_per_s"] / rows[1]["tokens_per_s"]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "regen_bench.json").write_text(json.dumps({"info": info, "rows": rows, "speedup": speed}, indent=2))
    lines = [f"Regeneration, {a.target}, {len(prompts)} prompts, <= {a.max_new_tokens} new tokens, T = 0.2, top-p 0.9; "
             f"{info['threads']} threads, commit {commit}, {info['date']}", "",
             "| engine | conversations | tokens | wall s | tok/s |", "|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        cells = [r["engine"], r["written"], r["tokens"], f"{r['seconds']:.1f}", f"{r['tokens_per_s']:.1f}"]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    lines += ["", f"dspark engine / HF generate: **{speed:.2f}x**; {info['batching_invariance']}"]
    (out / "regen_bench.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
