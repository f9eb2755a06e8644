"""Drafting cost per round, per component: batch 1, γ = 7, on the embedded target (or any target).

    python scripts/profile_draft.py --drafter DIR --out docs/data/draft_profile      # (make profile-draft)
    python scripts/profile_draft.py --layers 2 --out /tmp/draft_profile             # random drafters, no DIR

Variants (each a row): the draft vocabulary (the whole target vocabulary, then 16384 / 8192 / 4096 tokens) and
the drafter's weight precision (fp32, bf16), at T = 0 and T = 1. Components, in ms per round: backbone (cache
masks, embedding, decoder layers), lm_head (base logits over the draft vocabulary), sequential (the Markov head's
γ steps), confidence, sampling (fp32 softmax / argmax / inverse-CDF draw, mapping to target ids, q in the target
vocabulary), extend (the context cache update with the round's accepted features, as after a 3-token round).
Rounds interleave the variants; medians over ``--rounds``. With ``--drafter`` the drafter's own vocabulary and
weights are two more rows ("trained" in fp32 and bf16). Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from dspark_lightning import create, load_drafter, load_target
from dspark_lightning.infer.draft import BlockProposer
from dspark_lightning.infer.sampling import SamplingParams
from dspark_lightning.infer.sps import device_tag
from dspark_lightning.infer.verify import build_verifier

PARTS = ("backbone", "lm_head", "sequential", "confidence", "sampling", "extend")


def variants(target, a) -> dict:
    out = {}
    if a.drafter:
        out["trained"] = load_drafter(a.drafter, target, dtype="fp32")
        out["trained bf16"] = load_drafter(a.drafter, target, dtype="bf16")
    V = target.geometry.vocab_size
    for n in (None, 16384, 8192, 4096):
        torch.manual_seed(0)
        d = create("drafter", "dspark", target, block_size=7, backbone={"name": "dense", "num_layers": a.layers},
                   draft_vocab_size=n)  # fmt: skip
        if n is not None:
            d.set_draft_vocab(torch.arange(V)[torch.randperm(V)[:n]])
        out[f"vocab {n or V}"] = d.eval()
    d8 = create("drafter", "dspark", target, block_size=7, backbone={"name": "dense", "num_layers": a.layers},
                draft_vocab_size=8192)  # fmt: skip
    d8.set_draft_vocab(torch.arange(8192))
    out["vocab 8192 bf16"] = d8.to(torch.bfloat16).eval()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--drafter", default=None)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", default="docs/data/draft_profile")
    a = ap.parse_args()
    target = load_target(a.target)
    V = target.geometry.vocab_size
    torch.manual_seed(0)
    ctx = torch.randint(0, V, (a.context,)).tolist()
    pre = build_verifier("auto", target).prefill([0], [ctx])
    feats, hidden = pre.context, pre.hidden  # (1, P, n*d), (1, P, d)
    drafters = variants(target, a)
    props = {}
    for name, d in drafters.items():
        p = BlockProposer(d)
        p.add([0])
        p.extend([0], feats, torch.tensor([0]), torch.tensor([a.context]), hidden=hidden)
        props[name] = p
    res: dict = {(n, T): {k: [] for k in (*PARTS, "total")} for n in drafters for T in (0.0, 1.0)}
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for r in range(a.rounds + 2):
            for T in (0.0, 1.0):
                names = list(drafters) if r % 2 == 0 else list(reversed(drafters))
                for n in names:
                    p = props[n]
                    timing = p.clock.enable()
                    t0 = time.perf_counter()
                    p.propose([0], torch.tensor([5]), torch.tensor([a.context]), SamplingParams(T), gen)
                    p.extend([0], feats[:, :3], torch.tensor([a.context]), torch.tensor([3]), hidden=hidden[:, :3])
                    total = time.perf_counter() - t0
                    p.kv.release_after(torch.tensor([0]), torch.tensor([a.context - 1]))  # keep the context fixed
                    if r >= 2:  # warm-up rounds
                        for k in PARTS:
                            res[(n, T)][k].append(timing.get(k, 0.0))
                        res[(n, T)]["total"].append(total)
    rows = [{"variant": n, "T": T, **{k: round(statistics.median(v) * 1e3, 3) for k, v in parts.items()}}
            for (n, T), parts in res.items()]  # fmt: skip
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    info = {"target": a.target, "layers": a.layers, "block_size": 7, "batch": 1, "context": a.context,
            "rounds": a.rounds, "threads": torch.get_num_threads(), "cpu": device_tag(torch.device("cpu")),
            "commit": commit,
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "drafter": a.drafter}  # fmt: skip
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "draft_profile.json").write_text(json.dumps({"info": info, "rows": rows}, indent=2))
    head = f"Drafting per round (ms, median of {a.rounds}), batch 1, γ = 7, {a.layers}-layer DSpark drafter, "
    lines = [head + f"{a.context}-token context; {info['threads']} threads, commit {commit}, {info['date']}", "",
             "| variant | T | " + " | ".join(PARTS) + " | total |", "|---|---|" + "---|" * 7]  # fmt: skip
    for row in rows:
        ms = " | ".join(f"{row[k]:.2f}" for k in (*PARTS, "total"))
        lines.append(f"| {row['variant']} | {row['T']:g} | {ms} |")
    (out / "draft_profile.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
