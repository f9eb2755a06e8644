"""Draft-vocabulary coverage table: how much of the target's output a top-N vocabulary covers.

    python benchmarks/vocab_coverage.py --work_dir outputs/smollm2_dspark_long/data \
        --out benchmarks/results/data/vocab_coverage

For N in --sizes, the vocabulary is the N most frequent response tokens of the training conversations
(as ``fit`` picks it, stop tokens forced in). Columns: the share of training and held-out response
tokens inside it, and the mean target probability mass inside it at held-out response positions
(softmax of the target's logits at T = 1; what a drafter restricted to the subset can at best cover:
per position, acceptance <= mass inside the subset). Plotted against N.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from dspark_lightning import load_target
from dspark_lightning.data.features.extract import tokenize_conversations
from dspark_lightning.data.features.vocab import coverage, frequent_tokens, response_token_counts
from dspark_lightning.data.regen.regenerate import load_conversations


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--work_dir", required=True, help="a recipe's data directory (responses_{train,heldout}.jsonl)")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384, 32768])
    ap.add_argument("--mass_sequences", type=int, default=64, help="held-out conversations for the probability mass")
    ap.add_argument("--max_length", type=int, default=768)
    ap.add_argument("--out", default="benchmarks/results/data/vocab_coverage")
    a = ap.parse_args()
    target = load_target(a.target)
    V = target.geometry.vocab_size
    rows = {s: tokenize_conversations(target, load_conversations(Path(a.work_dir) / f"responses_{s}.jsonl"),
                                      a.max_length, 1) for s in ("train", "heldout")}  # fmt: skip
    counts = {s: response_token_counts(r, V) for s, r in rows.items()}
    vocabs = {n: frequent_tokens(counts["train"], min(n, V), target.stop_token_ids) for n in a.sizes}
    mass = {n: 0.0 for n in a.sizes}
    positions = 0
    with torch.no_grad():
        for r in rows["heldout"][: a.mass_sequences]:
            ids = torch.tensor([r["input_ids"]])
            mask = torch.tensor(r["loss_mask"], dtype=torch.bool)
            pos = torch.nonzero(mask).flatten() - 1  # the hidden state at t-1 predicts token t
            pos = pos[pos >= 0]
            p = target.logits(target(ids).hidden[0, pos]).float().softmax(-1)  # (P, V)
            positions += len(pos)
            for n, ids_n in vocabs.items():
                mass[n] += float(p[:, ids_n].sum())
    table = [
        {"N": n, "train_tokens": coverage(counts["train"], v), "heldout_tokens": coverage(counts["heldout"], v),
         "heldout_target_mass": mass[n] / max(positions, 1)}
        for n, v in vocabs.items()
    ]  # fmt: skip
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    info = {"target": a.target, "work_dir": a.work_dir, "vocab_size": V, "mass_positions": positions,
            "train_response_tokens": int(counts["train"].sum()),
            "heldout_response_tokens": int(counts["heldout"].sum())}  # fmt: skip
    (out / "vocab_coverage.json").write_text(json.dumps({"info": info, "rows": table}, indent=2))
    lines = [f"Draft-vocabulary coverage, {a.target} (V = {V}); vocabularies from {info['train_response_tokens']} "
             f"training response tokens; target mass over {positions} held-out response positions", "",
             "| N | train tokens covered | held-out tokens covered | held-out target mass covered |",
             "|---|---|---|---|"]  # fmt: skip
    for t in table:
        lines.append(f"| {t['N']} | {100 * t['train_tokens']:.2f}% | {100 * t['heldout_tokens']:.2f}% | "
                     f"{100 * t['heldout_target_mass']:.2f}% |")  # fmt: skip
    (out / "vocab_coverage.md").write_text("\n".join(lines) + "\n")
    from dspark_lightning.plots import plt

    fig, ax = plt.subplots(figsize=(5, 3.4))
    for key, label in (("heldout_tokens", "held-out response tokens"), ("heldout_target_mass", "held-out target mass")):
        ax.plot([t["N"] for t in table], [100 * t[key] for t in table], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("draft vocabulary size N")
    ax.set_ylabel("covered (%)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "vocab_coverage.png", dpi=110)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
