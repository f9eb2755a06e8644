"""Regeneration throughput: our engine (continuous batching) against HF ``generate`` on the same prompts.

    python benchmarks/bench_regen.py --out benchmarks/results/data/regen_bench          # (make bench-regen)
    python benchmarks/bench_regen.py --temperature 0 --vllm --out benchmarks/results/data/regen_bench_vllm

With ``--vllm``, vLLM's offline engine (``data.regen.backend: vllm``, the pinned venv) answers the same prompts too;
its start (the engine process, the model load) is reported apart from its answering rate.
Both backends answer the same prompts (first user turn, the recipe's sampling settings) into fresh
JSONL files; the table gives generated tokens, wall time and tokens/s, and checks that the dspark
backend's responses do not depend on the concurrency (a second, smaller-concurrency run on a subset).
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
from dspark_lightning.data.prompts.mixture import mixture
from dspark_lightning.data.regen.regenerate import regenerate
from dspark_lightning.devices import resolve_dtype


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max_new_tokens", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--hf_batch", type=int, default=24)
    ap.add_argument("--temperature", type=float, default=0.2)
    ap.add_argument("--dtypes", nargs="+", default=["fp32"], help="target precisions for our engine (fp32, bf16)")
    ap.add_argument("--vllm", action="store_true", help="also vLLM's offline engine (data.regen.backend: vllm)")
    ap.add_argument("--out", default="benchmarks/results/data/regen_bench")
    a = ap.parse_args()
    target = load_target(a.target)
    sources = [
        {"class_path": "gsm_symbolic", "init_args": {"limit": a.prompts // 2}},
        {"class_path": "sharegpt", "init_args": {"limit": a.prompts // 2}},
    ]
    prompts = mixture(sources, "train", 0.0, 42)[: a.prompts]
    top_p = 0.9 if a.temperature > 0 else 1.0
    kw = {"max_new_tokens": a.max_new_tokens, "temperature": a.temperature, "top_p": top_p, "max_turns": 1, "seed": 42}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        runs = [("dspark", {"backend": "dspark", "concurrency": a.concurrency}, "fp32"),
                ("hf", {"backend": "hf", "batch_size": a.hf_batch}, "fp32")]  # fmt: skip
        runs[1:1] = [(f"dspark {dt}", runs[0][1], dt) for dt in a.dtypes if dt != "fp32"]
        if a.vllm:
            runs.append(("vllm", {"backend": "vllm", "concurrency": a.concurrency}, "fp32"))
        for name, extra, dt in runs:
            tgt = target if dt == "fp32" else load_target(a.target, dtype=resolve_dtype(dt, "cpu"))
            st = regenerate(tgt, prompts, Path(tmp) / f"{name}.jsonl", **kw, **extra)
            keep = ("written", "tokens", "setup_s", "seconds", "tokens_per_s")
            rows.append({"backend": name, **{k: st[k] for k in keep}})
            print(rows[-1], flush=True)
        fp32 = {r["id"]: r["turns"] for r in _rows(Path(tmp) / "dspark.jsonl")}
        for name, _, dt in runs:
            if dt != "fp32" or name == "vllm":
                other = _rows(Path(tmp) / f"{name}.jsonl")
                same_dt = sum(fp32[r["id"]] == r["turns"] for r in other)
                next(r for r in rows if r["backend"] == name)["same_as_fp32"] = f"{same_dt}/{len(other)}"
        sub = prompts[: max(4, a.concurrency // 4)]
        regenerate(target, sub, Path(tmp) / "small.jsonl", **kw, backend="dspark", concurrency=3)
        big = {r["id"]: r["turns"] for r in _rows(Path(tmp) / "dspark.jsonl")}
        small = _rows(Path(tmp) / "small.jsonl")
        same = sum(big[r["id"]] == r["turns"] for r in small)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    info = {"target": a.target, "prompts": len(prompts), "max_new_tokens": a.max_new_tokens, "cpu_model": _cpu(),
            "concurrency": a.concurrency, "hf_batch": a.hf_batch, "threads": torch.get_num_threads(),
            "cpu": platform.processor(), "commit": commit,
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "batching_invariance": f"{same}/{len(small)} identical at concurrency 3 and {a.concurrency}"}  # fmt: skip
    hf = next(r for r in rows if r["backend"] == "hf")
    speed = rows[0]["tokens_per_s"] / hf["tokens_per_s"]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "regen_bench.json").write_text(json.dumps({"info": info, "rows": rows, "speedup": speed}, indent=2))
    lines = [f"Regeneration, {a.target}, {len(prompts)} prompts, <= {a.max_new_tokens} new tokens, "
             f"T = {a.temperature:g}, "
             f"top-p {top_p}; "
             f"{info['threads']} threads, commit {commit}, {info['date']}", "",
             "| backend | conversations | tokens | start s | wall s | tok/s | responses equal to dspark fp32's |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        cells = [r["backend"], r["written"], r["tokens"], f"{r['setup_s']:.1f}", f"{r['seconds']:.1f}",
                 f"{r['tokens_per_s']:.1f}", r.get("same_as_fp32", "–")]  # fmt: skip
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    lines += ["", f"dspark backend (fp32) / HF generate: **{speed:.2f}x**; {info['batching_invariance']}"]
    for r in rows[1:]:
        if r["backend"].startswith("dspark ") or r["backend"] == "vllm":
            lines.append(f"{r['backend']} / dspark fp32: **{r['tokens_per_s'] / rows[0]['tokens_per_s']:.2f}x**")
    (out / "regen_bench.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
