"""Where the time of one decoding round goes (a profiling benchmark; ``make profile-verify``, ``make profile-draft``).

    .venv/bin/python benchmarks/profile_breakdown.py verify --out DIR [--target NAME] [--tokens 1 2 4 8 16]
    .venv/bin/python benchmarks/profile_breakdown.py draft --out DIR [--drafter DIR] [--layers 2]

``verify``: one verification step as ``decode()`` runs it (forward over B new tokens after a cached context, LM head
over the B positions, fp32 softmax, rollback) for B in ``tokens``, per verifier: ``hf`` (the HF forward through
:class:`~dspark_lightning.infer.verify.hf.HFVerifier`: ragged cache, dense mask), ``lean-linear``
(:class:`~dspark_lightning.infer.verify.lean.LeanVerifier` with ``F.linear`` products; on a CPU) and ``lean`` (the
matrix kernels chosen on this machine, :mod:`dspark_lightning.infer.verify.kernels`; the default). Rounds interleave
the variants (every B, every variant, then again, reversed) so machine drift hits all alike; medians and the ratio to
the smallest B,
then a torch-profiler breakdown (self time per op) of the default verifier at B = 1 and 8.

``draft``: the drafting cost of one round per component, batch 1, γ = 7: backbone (cache masks, embedding, decoder
layers), lm_head (base logits over the draft vocabulary), sequential (the Markov head's γ steps), confidence,
sampling (fp32 softmax / argmax / inverse-CDF draw, mapping to target ids, q in the target vocabulary), extend (the
context-cache update with the round's accepted features, as after a 3-token round). Variants (one row each, at
T = 0 and 1): random DSpark drafters with the whole target vocabulary and with 16384 / 8192 / 4096-token draft
vocabularies (those smaller than the target's), one with 8192 tokens in bf16, and the given trained drafters.

Both write ``<out>/verify_profile.{json,md}`` or ``<out>/draft_profile.{json,md}``. Timings: run alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from dspark_lightning.devices import device_tag  # noqa: E402

DRAFT_PARTS = ("backbone", "lm_head", "sequential", "confidence", "sampling", "extend")
DRAFT_VOCABS = (16384, 8192, 4096)  # draft-vocabulary sizes of the random variants (those below the target's)
OUTPUT_FILES = {
    "verify": ("verify_profile.json", "verify_profile.md"),
    "draft": ("draft_profile.json", "draft_profile.md"),
}


def _commit() -> str:
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
    return r.stdout.strip() or "unknown"


def _info(target, device: torch.device, **extra: Any) -> dict:
    return {
        "target": target.name,
        "threads": torch.get_num_threads(),
        "device": device_tag(device),
        "cpu": platform.processor(),
        "commit": _commit(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        **extra,
    }


def _device(target) -> torch.device:
    return next(target.model.parameters()).device


def _verifiers(target) -> dict[str, Any]:
    from dspark_lightning.infer.verify.hf import HFVerifier
    from dspark_lightning.infer.verify.lean import LeanVerifier, lean_unsupported

    out = {"hf": HFVerifier(target)}
    if lean_unsupported(target, "padded") is None:
        if _device(target).type == "cpu":
            out["lean-linear"] = LeanVerifier(target, kernels="linear")
        out["lean"] = LeanVerifier(target)
    return out


def _verify_step(v, toks: torch.Tensor, context: int):
    B = toks.shape[1]
    one = torch.tensor([0])

    def run():
        out = v.forward([0], toks, torch.tensor([B]), torch.tensor([context]))
        v.logits(out.hidden).float().softmax(-1)
        v.commit(one, torch.tensor([context - 1]))

    return run


def _op_breakdown(v, toks: torch.Tensor, context: int, steps: int = 5, top: int = 8) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    run = _verify_step(v, toks, context)
    for _ in range(2):
        run()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            run()
    rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:top]
    return [{"op": e.key, "ms_per_step": e.self_cpu_time_total / 1e3 / steps, "calls": e.count // steps} for e in rows]


def verify_breakdown(
    target, *, context: int = 512, tokens: tuple[int, ...] = (1, 2, 4, 8, 16), rounds: int = 9, seed: int = 0
) -> dict:
    """Median ms of one verification step per verifier and B, and the op breakdown of the default one at B = 1, 8."""
    torch.manual_seed(seed)
    device = _device(target)
    V = target.geometry.vocab_size
    ctx = torch.randint(0, V, (context,)).tolist()
    variants = _verifiers(target)
    for v in variants.values():
        v.prefill([0], [ctx])
    toks = {B: torch.randint(0, V, (1, B)).to(device) for B in tokens}
    samples: dict[tuple[str, int], list[float]] = {(n, B): [] for n in variants for B in tokens}
    with torch.no_grad():
        for v in variants.values():  # warm-up
            for B in tokens:
                _verify_step(v, toks[B], context)()
        for r in range(rounds):
            order = list(variants) if r % 2 == 0 else list(reversed(variants))
            for B in tokens:
                for n in order:
                    run = _verify_step(variants[n], toks[B], context)
                    t0 = time.perf_counter()
                    run()
                    samples[(n, B)].append(time.perf_counter() - t0)
        default = list(variants)[-1]  # lean where it runs, else hf
        ops = {B: _op_breakdown(variants[default], toks[B], context) for B in (1, 8) if B in tokens}
    med = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
    rows = [
        {"B": B, **{f"{n}_ms": round(med[(n, B)], 2) for n in variants},
         **{f"{n}_vs_B1": round(med[(n, B)] / med[(n, tokens[0])], 2) for n in variants}}
        for B in tokens
    ]  # fmt: skip
    from dspark_lightning.infer.profiling import roofline as rf

    nbytes, machine = rf.step_bytes(target), rf.Machine.measure(device, next(target.model.parameters()).dtype)
    roof = rf.roofline_rows({B: med[(default, B)] / 1e3 for B in tokens}, nbytes, machine, context)
    info = _info(target, device, context=context, rounds=rounds, variants=list(variants), breakdown_of=default,
                 bandwidth_gb_s=round(machine.bandwidth / 1e9, 2), gflop_s=round(machine.flops / 1e9, 1),
                 weight_mb=round(nbytes.weights / 1e6, 1))  # fmt: skip
    return {"info": info, "rows": rows, "roofline": roof, "breakdown": ops}


def verify_markdown(doc: dict) -> str:
    info, variants = doc["info"], doc["info"]["variants"]
    lines = [f"Verification step (forward + LM head + fp32 softmax + rollback), {info['target']}, {info['context']}-"
             f"token cache, median of {info['rounds']} interleaved rounds; {info['device']}, commit {info['commit']}, "
             f"{info['date']}", "",
             "| B | " + " | ".join([*(f"{n} ms" for n in variants), *(f"{n} / B=1" for n in variants)]) + " |",
             "|---|" + "---|" * (2 * len(variants))]  # fmt: skip
    for row in doc["rows"]:
        lines.append(f"| {row['B']} | " + " | ".join(f"{row[f'{n}_ms']:.1f}" for n in variants) + " | "
                     + " | ".join(f"{row[f'{n}_vs_B1']:.2f}" for n in variants) + " |")  # fmt: skip
    if doc.get("roofline"):
        lines += ["", f"Roofline of the {info['breakdown_of']} verifier: {info['weight_mb']} MB of weights a step plus "
                  f"the KV of {info['context']} tokens; measured here: read bandwidth {info['bandwidth_gb_s']} GB/s, "
                  f"matrix products {info['gflop_s']} GFLOP/s:", "",
                  "| B | MB read | GFLOP | memory floor ms | compute floor ms | step ms | step / floor |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
        lines += [f"| {r['B']} | {r['mb']} | {r['gflop']} | {r['memory_ms']} | {r['compute_ms']} | {r['ms']} | "
                  f"{r['x_floor']} |" for r in doc["roofline"]]  # fmt: skip
    for B, ops in doc["breakdown"].items():
        lines += ["", f"Self time per step, {info['breakdown_of']} verifier, B = {B}:", "",
                  "| op | ms / step | calls / step |", "|---|---|---|"]  # fmt: skip
        lines += [f"| `{o['op']}` | {o['ms_per_step']:.2f} | {o['calls']} |" for o in ops]
    return "\n".join(lines)


def draft_variants(target, trained: dict[str, Any] | None = None, layers: int = 2, block_size: int = 7) -> dict:
    """Name -> drafter: ``trained`` first, then random DSpark drafters (whole vocabulary, smaller draft
    vocabularies, 8192 tokens in bf16), on the target's device."""
    from dspark_lightning.registry import create

    device = _device(target)
    out = dict(trained or {})
    V = target.geometry.vocab_size
    backbone = {"class_path": "dense", "init_args": {"num_layers": layers}}
    subsets = [n for n in DRAFT_VOCABS if n < V]
    for n in (None, *subsets):
        torch.manual_seed(0)
        d = create("drafter", "dspark", target, block_size=block_size, backbone=backbone, draft_vocab_size=n)
        if n is not None:
            d.set_draft_vocab(torch.arange(V)[torch.randperm(V)[:n]])
        out[f"vocab {n or V}"] = d.to(device).eval()
    n16 = 8192 if 8192 in subsets else None
    d16 = create("drafter", "dspark", target, block_size=block_size, backbone=backbone, draft_vocab_size=n16)
    if n16 is not None:
        d16.set_draft_vocab(torch.arange(n16))
    out[f"vocab {n16 or V} bf16"] = d16.to(device=device, dtype=torch.bfloat16).eval()
    return out


def draft_breakdown(target, drafters: dict[str, Any], *, context: int = 512, rounds: int = 15, seed: int = 0) -> dict:
    """Median ms per round of each drafting component, per drafter and T in (0, 1), after 2 warm-up rounds."""
    from dspark_lightning.infer.acceptance.sampling import SamplingParams
    from dspark_lightning.infer.propose.draft import BlockProposer
    from dspark_lightning.infer.verify.hf import build_verifier

    device = _device(target)
    V = target.geometry.vocab_size
    torch.manual_seed(seed)
    ctx = torch.randint(0, V, (context,)).tolist()
    pre = build_verifier("auto", target).prefill([0], [ctx])
    feats, hidden = pre.context, pre.hidden  # (1, P, n*d), (1, P, d)
    props = {}
    for name, d in drafters.items():
        p = BlockProposer(d)
        p.add([0])
        p.extend([0], feats, torch.tensor([0]), torch.tensor([context]), hidden=hidden)
        props[name] = p
    block = {name: d.block_size for name, d in drafters.items()}
    res: dict = {(n, T): {k: [] for k in (*DRAFT_PARTS, "total")} for n in drafters for T in (0.0, 1.0)}
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for r in range(rounds + 2):
            for T in (0.0, 1.0):
                for n in list(drafters) if r % 2 == 0 else list(reversed(drafters)):
                    p = props[n]
                    timing = p.clock.enable()
                    t0 = time.perf_counter()
                    p.propose([0], torch.tensor([5]), torch.tensor([context]), SamplingParams(T), gen)
                    p.extend([0], feats[:, :3], torch.tensor([context]), torch.tensor([3]), hidden=hidden[:, :3])
                    total = time.perf_counter() - t0
                    p.kv.release_after(torch.tensor([0]), torch.tensor([context - 1]))  # keep the context fixed
                    if r >= 2:  # warm-up rounds
                        for k in DRAFT_PARTS:
                            res[(n, T)][k].append(timing.get(k, 0.0))
                        res[(n, T)]["total"].append(total)
    rows = [{"variant": n, "T": T, "block_size": block[n],
             **{k: round(statistics.median(v) * 1e3, 3) for k, v in parts.items()}}
            for (n, T), parts in res.items()]  # fmt: skip
    layers = {n: getattr(getattr(d, "backbone", None), "num_layers", None) for n, d in drafters.items()}
    info = _info(target, device, batch=1, context=context, rounds=rounds, layers=layers)
    return {"info": info, "rows": rows}


def draft_markdown(doc: dict) -> str:
    info = doc["info"]
    lines = [f"Drafting per round (ms, median of {info['rounds']}), batch 1, {info['target']}, {info['context']}-token "
             f"context; {info['threads']} threads, {info['device']}, commit {info['commit']}, {info['date']}", "",
             "| variant | γ | T | " + " | ".join(DRAFT_PARTS) + " | total |",
             "|---|---|---|" + "---|" * (len(DRAFT_PARTS) + 1)]  # fmt: skip
    for row in doc["rows"]:
        ms = " | ".join(f"{row[k]:.2f}" for k in (*DRAFT_PARTS, "total"))
        lines.append(f"| {row['variant']} | {row['block_size']} | {row['T']:g} | {ms} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    from dspark_lightning.atomic import atomic_write
    from dspark_lightning.checkpoint import load_drafter, load_target_and_drafters

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=tuple(OUTPUT_FILES), help="verify: one verification step per verifier and B, "
                    "and its ops; draft: one drafting round per component and drafter variant")  # fmt: skip
    ap.add_argument("--out", required=True, help="writes <out>/{verify,draft}_profile.{json,md}")
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--context_len", type=int, default=512, help="cached context tokens during a round")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="verify: the B timed")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved timed rounds (default: 9 verify, 15 draft)")
    ap.add_argument("--drafter", default=None, help="draft: a trained drafter, timed in fp32 and bf16")
    ap.add_argument("--layers", type=int, default=2, help="draft: layers of the random DSpark drafters")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    a = ap.parse_args(argv)
    if a.drafter is not None and a.what != "draft":
        ap.error("--drafter is timed by the draft breakdown")
    if min(a.tokens) < 1 or a.context_len < 1 or a.layers < 1 or (a.rounds is not None and a.rounds < 1):
        ap.error("--tokens, --context_len, --layers and --rounds must be >= 1")
    tgt, fp32 = load_target_and_drafters(a.target, [a.drafter] if a.drafter else [], dtype=a.dtype, device=a.device,
                                         drafter_dtype="fp32")  # fmt: skip
    if a.what == "verify":
        doc = verify_breakdown(tgt, context=a.context_len, tokens=tuple(a.tokens), rounds=a.rounds or 9)
        md = verify_markdown(doc)
    else:
        trained = {}
        if a.drafter is not None:
            trained["trained"] = fp32[0]
            trained["trained bf16"] = load_drafter(a.drafter, tgt, dtype="bf16")
        doc = draft_breakdown(tgt, draft_variants(tgt, trained, layers=a.layers), context=a.context_len,
                              rounds=a.rounds or 15)  # fmt: skip
        doc["info"]["drafter"] = a.drafter
        md = draft_markdown(doc)
    folder = Path(a.out)
    folder.mkdir(parents=True, exist_ok=True)
    json_name, md_name = OUTPUT_FILES[a.what]
    atomic_write(folder / json_name, json.dumps(doc, indent=2) + "\n")
    atomic_write(folder / md_name, md + "\n")
    print(md)
    print(f"-> {folder / json_name}, {folder / md_name}", file=sys.stderr)


if __name__ == "__main__":
    main()
