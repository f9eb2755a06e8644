"""Verification cost: the target forward over B new tokens after a cached context, per verifier.

    python scripts/profile_verify.py --out docs/data/verify_profile      # (make profile-verify)

Times, for B = 1, 2, 4, 8, 16 new tokens over a ``--context`` token cache, one verification step as
``decode()`` runs it (forward, LM head over the B positions, fp32 softmax, rollback) for:
- ``hf``: the HF forward through :class:`HFVerifier` (ragged cache, dense mask);
- ``lean-linear``: :class:`LeanVerifier` with ``F.linear`` products;
- ``lean``: :class:`LeanVerifier` with MKL-packed products (the default on CPUs with MKL).
Rounds interleave the variants (every B, every variant, then again) so machine drift hits all alike;
the table gives medians and the ratio to B = 1. A torch-profiler breakdown of the default verifier at
B = 1 and 8 (self time per op) follows. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from dspark_lightning import load_target
from dspark_lightning.infer.lean import LeanVerifier
from dspark_lightning.infer.sps import device_tag
from dspark_lightning.infer.verify import HFVerifier


def step_fn(v, toks, context):
    B = toks.shape[1]
    one = torch.tensor([0])

    def run():
        out = v.forward([0], toks, torch.tensor([B]), torch.tensor([context]))
        v.logits(out.hidden).float().softmax(-1)
        v.commit(one, torch.tensor([context - 1]))

    return run


def breakdown(v, toks, context, steps=5) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    run = step_fn(v, toks, context)
    for _ in range(2):
        run()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            run()
    rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:8]
    return [{"op": e.key, "ms_per_step": e.self_cpu_time_total / 1e3 / steps, "calls": e.count // steps} for e in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--out", default="docs/data/verify_profile")
    a = ap.parse_args()
    torch.manual_seed(0)
    target = load_target(a.target)
    V = target.geometry.vocab_size
    ctx = torch.randint(0, V, (a.context,)).tolist()
    variants = {"hf": HFVerifier(target), "lean-linear": LeanVerifier(target, pack=False), "lean": LeanVerifier(target)}
    for v in variants.values():
        v.prefill([0], [ctx])
    toks = {B: torch.randint(0, V, (1, B)) for B in a.tokens}
    samples = {(n, B): [] for n in variants for B in a.tokens}
    with torch.no_grad():
        for v in variants.values():  # warm-up
            for B in a.tokens:
                step_fn(v, toks[B], a.context)()
        for r in range(a.rounds):
            order = list(variants) if r % 2 == 0 else list(reversed(variants))
            for B in a.tokens:
                for n in order:
                    run = step_fn(variants[n], toks[B], a.context)
                    t0 = time.perf_counter()
                    run()
                    samples[(n, B)].append(time.perf_counter() - t0)
        prof = {B: breakdown(variants["lean"], toks[B], a.context) for B in (1, 8) if B in a.tokens}
    med = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    info = {
        "target": a.target, "context": a.context, "rounds": a.rounds, "threads": torch.get_num_threads(),
        "device": device_tag(torch.device("cpu")), "cpu": platform.processor(), "commit": commit,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "torch": torch.__version__,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    }  # fmt: skip
    rows = [
        {"B": B, **{f"{n}_ms": round(med[(n, B)], 2) for n in variants},
         **{f"{n}_vs_B1": round(med[(n, B)] / med[(n, a.tokens[0])], 2) for n in variants}}
        for B in a.tokens
    ]  # fmt: skip
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "verify_profile.json").write_text(json.dumps({"info": info, "rows": rows, "breakdown": prof}, indent=2))
    lines = [f"Verification step (forward + LM head + fp32 softmax + rollback), {a.target}, {a.context}-token cache, "
             f"median of {a.rounds} interleaved rounds; {info['device']}, commit {commit}, {info['date']}", "",
             "| B | " + " | ".join([*(f"{n} ms" for n in variants), *(f"{n} / B=1" for n in variants)]) + " |",
             "|---|" + "---|" * (2 * len(variants))]  # fmt: skip
    for row in rows:
        lines.append(f"| {row['B']} | " + " | ".join(f"{row[f'{n}_ms']:.1f}" for n in variants) + " | "
                     + " | ".join(f"{row[f'{n}_vs_B1']:.2f}" for n in variants) + " |")  # fmt: skip
    for B, ops in prof.items():
        lines += [
            "",
            f"Self time per step, lean verifier, B = {B}:",
            "",
            "| op | ms / step | calls / step |",
            "|---|---|---|",
        ]
        lines += [f"| `{o['op']}` | {o['ms_per_step']:.2f} | {o['calls']} |" for o in ops]
    (out / "verify_profile.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
