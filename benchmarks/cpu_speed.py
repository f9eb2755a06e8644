"""Does the runtime hold its numbers on this CPU? Kernels, roofline, and default decode() against plain, per domain.

    .venv/bin/python benchmarks/cpu_speed.py --drafter DIR --out docs/data/cpu_speed     (make cpu-speed)

Writes ``<out>/<cpu>.json`` and ``.md``: the CPU (model, threads), the matrix kernels this machine chose (per shape
and row count), the verification step per B with its memory-bound floor (lean verifier, 512 cached tokens), and
decode() at batch 1, T = 0 with its default scheduler against plain decode() on the built-in math / code / chat
evaluation prompts, each prompt decoded plain and speculative back to back (the order alternating) so that machine
drift hits both alike. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import subprocess
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def decode_speed(target, drafter, domains, n: int, max_new_tokens: int) -> list[dict]:
    from dspark_lightning.data.evalsets import eval_prompts
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
                     "tau": round(committed / rounds, 3) if rounds else None, "greedy_equal": f"{same}/{len(prompts)}"})  # fmt: skip
        print(rows[-1], flush=True)
    return rows


def kernel_summary(target) -> dict:
    from dspark_lightning.infer import LeanVerifier

    table = LeanVerifier(target).kernels
    if table is None:
        return {}
    return {key: {str(r): p for r, p in sorted(by.items())} for key, by in table.choices.items()}


def markdown(doc: dict) -> str:
    info = doc["info"]
    lines = [f"# CPU speed: {info['cpu']} ({info['threads']} threads)", "",
             f"torch {info['torch']}, commit {info['commit']}, {info['date']}; drafter `{info['drafter']}`.", "",
             "## Verification step against its memory-bound floor", "",
             f"Weights {info['weight_mb']} MB a step; read bandwidth measured {info['bandwidth_gb_s']} GB/s.", "",
             "| B | " + " | ".join(f"{v} ms" for v in doc["verify"]["info"]["variants"]) + " | lean floor ms | lean / floor"
             " | lean / B=1 |", "|---|" + "---|" * (len(doc["verify"]["info"]["variants"]) + 3)]  # fmt: skip
    base = doc["verify"]["rows"][0]["lean_ms"] if "lean_ms" in doc["verify"]["rows"][0] else None
    for row, roof in zip(doc["verify"]["rows"], doc["verify"]["roofline"], strict=True):
        ms = " | ".join(f"{row[f'{v}_ms']:.1f}" for v in doc["verify"]["info"]["variants"])
        ratio = f"{row['lean_ms'] / base:.2f}" if base else "–"
        lines.append(f"| {row['B']} | {ms} | {roof['floor_ms']:.1f} | {roof['x_floor']:.2f} | {ratio} |")
    lines += ["", "## decode() at batch 1, T = 0: default scheduler against plain", "",
              "| set | prompts | plain tok/s | default tok/s | default / plain | τ | greedy = plain |",
              "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in doc["decode"]:
        lines.append(f"| {r['domain']} | {r['prompts']} | {r['plain_tok_s']} | {r['default_tok_s']} | "
                     f"{r['speedup']:.2f}× | {r['tau']} | {r['greedy_equal']} |")  # fmt: skip
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
    ap.add_argument("--out", default=str(ROOT / "docs/data/cpu_speed"))
    ap.add_argument("--prompts_per_domain", type=int, default=10)
    ap.add_argument("--max_new_tokens", type=int, default=128)
    ap.add_argument("--domains", nargs="+", default=["math", "code", "chat"])
    a = ap.parse_args(argv)
    from dspark_lightning import load_drafter, load_target
    from dspark_lightning.infer.breakdown import verify_breakdown

    target = load_target("smollm2-135m-instruct")
    drafter = load_drafter(a.drafter, target, dtype="auto")
    kernels = kernel_summary(target)
    verify = verify_breakdown(target, tokens=(1, 2, 4, 8, 16), rounds=7)
    rows = decode_speed(target, drafter, a.domains, a.prompts_per_domain, a.max_new_tokens)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    info = {"cpu": cpu_model(), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "commit": commit.stdout.strip(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "drafter": a.drafter, "weight_mb": verify["info"]["weight_mb"],
            "bandwidth_gb_s": verify["info"]["bandwidth_gb_s"]}  # fmt: skip
    doc = {"info": info, "kernels": kernels, "verify": verify, "decode": rows}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = re.sub(r"[^A-Za-z0-9]+", "_", info["cpu"]).strip("_") + f"_{info['threads']}t"
    (out / f"{tag}.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / f"{tag}.md").write_text(markdown(doc))
    print(markdown(doc))
    print(f"-> {out / tag}.md")


if __name__ == "__main__":
    main()
