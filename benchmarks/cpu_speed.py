"""Does the runtime hold its numbers on this CPU? Kernels, roofline, and default decode() against plain, per domain.

    .venv/bin/python benchmarks/cpu_speed.py --drafter DIR --out benchmarks/results/data/cpu_speed     (make cpu-speed)

Writes ``<out>/<cpu>.json`` and ``.md``: the CPU (model, threads), the matrix kernels this machine chose (per shape
and row count), the verification step per B with its memory-bound floor (lean verifier, 512 cached tokens), and
decode() at batch 1, T = 0 with its default scheduler against plain decode() on the built-in math / code / chat
evaluation prompts, each prompt decoded plain and speculative back to back (the order alternating) so that machine
drift hits both alike. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import time
from pathlib import Path

import torch

from dspark_lightning.atomic import atomic_write
from dspark_lightning.devices import cpu_model

ROOT = Path(__file__).resolve().parents[1]


def decode_speed(target, drafter, domains, n: int, max_new_tokens: int) -> list[dict]:
    from dspark_lightning.data.prompts.evalsets import eval_prompts
    from dspark_lightning.infer import decode

    warm = eval_prompts(domains[0], 1)[0].turns[0]
    decode(target, drafter, [warm], max_new_tokens=8)  # one-time profiles (kernels, SPS, drafting cost) first
    decode(target, None, [warm], max_new_tokens=8)
    rows = []
    for domain in domains:
        t = {"plain": 0.0, "default": 0.0}
        toks = {"plain": 0, "default": 0}
        rounds = committed = 0
        same = 0
        prompts = [r.turns[0] for r in eval_prompts(domain, n)]
        for i, p in enumerate(prompts):
            order = ("plain", "default") if i % 2 == 0 else ("default", "plain")
            out = {}
            for kind in order:
                t0 = time.perf_counter()
                res = decode(target, drafter if kind == "default" else None, [p], max_new_tokens=max_new_tokens)
                t[kind] += time.perf_counter() - t0
                toks[kind] += res.stats.generated_tokens
                out[kind] = res.token_ids[0]
                if kind == "default":
                    rounds += res.stats.rounds
                    committed += round(res.stats.tau * res.stats.rounds) if res.stats.rounds else 0
            same += out["plain"] == out["default"]
        plain, dflt = toks["plain"] / t["plain"], toks["default"] / t["default"]
        rows.append({"domain": domain, "prompts": len(prompts), "plain_tok_s": round(plain, 2),
                     "default_tok_s": round(dflt, 2), "speedup": round(dflt / plain, 3),
                     "tau": round(committed / rounds, 3) if rounds else None,
                     "greedy_equal": f"{same}/{len(prompts)}"})  # fmt: skip
        print(rows[-1], flush=True)
    return rows


def kernel_summary(target) -> dict:
    from dspark_lightning.infer import LeanVerifier
    from dspark_lightning.infer.verify.lean import _shape_keys

    table = LeanVerifier(target).kernels
    if table is None:
        return {}
    mine = _shape_keys(target)
    return {key: {str(r): p for r, p in sorted(by.items())} for key, by in table.choices.items() if key in mine}


def llamacpp_anchor() -> dict:
    """llama.cpp on the same CPU (llama-bench on the target converted to F32, our runtime's weights): plain decode
    of 128 tokens and prompt processing of 1/2/4/8 tokens, what verifying a block costs there. Skipped (empty) when
    llama.cpp's tools are not built (``make llamacpp-tools``)."""
    import sys

    from dspark_lightning.export import llamacpp as lc
    from dspark_lightning.targets.embedded import SMOLLM2, embedded_path

    try:
        lc.tool("llama-bench")
    except lc.LlamaCppUnavailable as exc:
        print(f"[cpu-speed] no llama.cpp anchor: {exc}")
        return {}
    sys.path.insert(0, str(Path(__file__).parent))
    from llamacpp import bench_plain

    gguf = ROOT / "outputs/llamacpp/target-f32.gguf"
    if not gguf.is_file():
        gguf.parent.mkdir(parents=True, exist_ok=True)
        lc.convert(embedded_path(SMOLLM2), gguf, "f32")
    return bench_plain(gguf)


def markdown(doc: dict) -> str:
    info, variants = doc["info"], doc["verify"]["info"]["variants"]
    lines = [f"# CPU speed: {info['cpu']} ({info['threads']} threads)", "",
             f"torch {info['torch']}, commit {info['commit']}, {info['date']}; drafter `{info['drafter']}`.", "",
             "## Verification step against its floor", "",
             f"Weights {info['weight_mb']} MB a step; measured here: read bandwidth {info['bandwidth_gb_s']} GB/s, "
             f"matrix products {info['gflop_s']} GFLOP/s. Floor = the larger of bytes / bandwidth and flops / "
             "throughput.", "",
             "| B | " + " | ".join(f"{v} ms" for v in variants) + " | memory floor ms | compute floor ms | "
             "lean / floor | lean / B=1 |", "|---|" + "---|" * (len(variants) + 4)]  # fmt: skip
    base = doc["verify"]["rows"][0]["lean_ms"] if "lean_ms" in doc["verify"]["rows"][0] else None
    for row, roof in zip(doc["verify"]["rows"], doc["verify"]["roofline"], strict=True):
        ms = " | ".join(f"{row[f'{v}_ms']:.1f}" for v in variants)
        ratio = f"{row['lean_ms'] / base:.2f}" if base else "–"
        lines.append(
            f"| {row['B']} | {ms} | {roof['memory_ms']:.1f} | {roof['compute_ms']:.1f} | "
            f"{roof['x_floor']:.2f} | {ratio} |"
        )
    lines += ["", "## decode() at batch 1, T = 0: default scheduler against plain", "",
              "| set | prompts | plain tok/s | default tok/s | default / plain | τ | greedy = plain |",
              "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in doc["decode"]:
        lines.append(f"| {r['domain']} | {r['prompts']} | {r['plain_tok_s']} | {r['default_tok_s']} | "
                     f"{r['speedup']:.2f}× | {r['tau']} | {r['greedy_equal']} |")  # fmt: skip
    lc = doc.get("llamacpp") or {}
    if lc:
        ours = {r["B"]: r["lean_ms"] for r in doc["verify"]["rows"]}
        lines += ["", "## The anchor: llama.cpp on the same CPU (F32 target, llama-bench, same run)", "",
                  "| | 1 token | 2 tokens | 4 tokens | 8 tokens | plain decode |", "|---|---|---|---|---|---|",
                  "| llama.cpp ms | " + " | ".join(f"{1000 * k / lc[f'pp{k}']:.1f}" for k in (1, 2, 4, 8))
                  + f" | {1000 / lc['tg128']:.1f} ms/token ({lc['tg128']} tok/s) |",
                  "| ours (lean) ms | " + " | ".join(f"{ours.get(k, float('nan')):.1f}" for k in (1, 2, 4, 8))
                  + " | " + " / ".join(f"{r['plain_tok_s']}" for r in doc["decode"]) + " tok/s |"]  # fmt: skip
    lines += ["", "## Matrix kernels chosen (shape: rows → path)", ""]
    for key, by in doc["kernels"].items():
        runs, prev = [], None
        for r, p in by.items():
            if p != prev:
                runs.append(f"{r}: {p}")
                prev = p
        lines.append(f"- `{key}`: " + ", ".join(runs))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/data/cpu_speed"))
    ap.add_argument("--prompts_per_domain", type=int, default=10)
    ap.add_argument("--max_new_tokens", type=int, default=128)
    ap.add_argument("--domains", nargs="+", default=["math", "code", "chat"])
    a = ap.parse_args(argv)
    from profile_breakdown import verify_breakdown  # benchmarks/, beside this script

    from dspark_lightning import load_drafter, load_target
    from dspark_lightning.checkpoint import recorded_target_args

    target = load_target("smollm2-135m-instruct", **recorded_target_args(a.drafter))
    drafter = load_drafter(a.drafter, target, dtype="auto")
    kernels = kernel_summary(target)
    verify = verify_breakdown(target, tokens=(1, 2, 4, 8, 16), rounds=7)
    rows = decode_speed(target, drafter, a.domains, a.prompts_per_domain, a.max_new_tokens)
    anchor = llamacpp_anchor()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    info = {"cpu": cpu_model(), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "commit": commit.stdout.strip(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "drafter": a.drafter, "weight_mb": verify["info"]["weight_mb"],
            "bandwidth_gb_s": verify["info"]["bandwidth_gb_s"], "gflop_s": verify["info"]["gflop_s"]}  # fmt: skip
    doc = {"info": info, "kernels": kernels, "verify": verify, "decode": rows, "llamacpp": anchor}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = re.sub(r"[^A-Za-z0-9]+", "_", info["cpu"]).strip("_") + f"_{info['threads']}t"
    atomic_write(out / f"{tag}.json", json.dumps(doc, indent=1) + "\n")
    atomic_write(out / f"{tag}.md", markdown(doc))
    print(markdown(doc))
    print(f"-> {out / tag}.md")


if __name__ == "__main__":
    main()
