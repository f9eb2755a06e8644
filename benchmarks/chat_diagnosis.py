"""Why chat's acceptance flattens: one drafter's greedy rounds on held-out prompts of every set, taken apart.

    python benchmarks/chat_diagnosis.py --drafter outputs/smollm2_dspark/tb/version_0/drafter \
        --heldout outputs/smollm2_dspark/data/responses_heldout.jsonl \
        --train outputs/smollm2_dspark/data/responses_train.jsonl

Every held-out prompt (``--per_set`` per set, data-curve's fixed order) is decoded at T = 0 with static γ
(default 7, every draft verified) for ``--max_new_tokens`` (default 256, past the 96 tokens the training answers
hold). From the round log it reports, per set:

- the conditional acceptance A_k per block position and the survival S_k;
- acceptance by answer position (the round's first drafted token's index in the answer, in bins): does it fall
  beyond the 96th token, where no training answer reached?
- the share of the target's answer tokens outside the drafter's vocabulary, and outside the N most frequent tokens
  of the training answers for N = 8 k, 16 k, 32 k;
- at each rejection (the first draft the target did not pick), what kind of token the target picked there.

Writes ``chat_diagnosis.json`` and ``chat_diagnosis.md`` into ``--out``, with the command, CPU, commit and date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dspark_lightning.atomic import atomic_write  # noqa: E402
from dspark_lightning.data.features.vocab import frequent_tokens  # noqa: E402
from dspark_lightning.data.prompts.evalsets import heldout_prompts  # noqa: E402
from dspark_lightning.devices import cpu_model  # noqa: E402
from dspark_lightning.infer import decode  # noqa: E402
from dspark_lightning.infer.decode import load_target_and_drafters  # noqa: E402

BINS = (0, 32, 64, 96, 128, 192, 256)
KINDS = ("newline", "space/indent", "punctuation", "digit", "code symbol", "word start", "word piece", "special")


def token_kind(piece: str, special: bool) -> str:
    """A coarse class of one token's surface form (byte-level BPE: 'Ġ' a leading space, 'Ċ' a newline)."""
    if special:
        return "special"
    text = piece.replace("Ġ", " ").replace("Ċ", "\n").replace("ĉ", "\t")
    core = text.strip(" \t")
    if "\n" in text:
        return "newline"
    if not core:
        return "space/indent"
    if core.isdigit():
        return "digit"
    if core.isalpha():
        return "word start" if text[:1] in (" ", "\t") else "word piece"
    if all(c in ".,;:!?'\"-()" for c in core):
        return "punctuation"
    return "code symbol" if any(c in "{}[]<>=+*/\\|&^%$#@`~_" for c in core) else "punctuation"


def answer_counts(path: Path, target, vocab_size: int) -> torch.Tensor:
    """Token counts of the assistant turns of a responses JSONL (the training answers the vocabulary is drawn from)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                for turn in json.loads(line).get("turns", []):
                    if turn.get("role") == "assistant":
                        ids = target.tokenizer(turn["content"], add_special_tokens=False)["input_ids"]
                        counts += torch.bincount(torch.tensor(ids, dtype=torch.long), minlength=vocab_size)
    return counts


def analyse(res, target, gamma: int, vocabs: dict[str, torch.Tensor]) -> dict:
    """Per-position, per-answer-position and per-kind statistics of one set's decoded rounds."""
    log = res.log
    special = set(target.tokenizer.all_special_ids)
    pos_ok, pos_n = [0] * gamma, [0] * gamma
    bin_acc = {b: [0, 0, 0] for b in BINS[:-1]}  # bin -> [rounds, accepted drafts, first draft accepted]
    kinds, kinds_all = Counter(), Counter()
    start = Counter()  # request -> answer position of its next round's first drafted token
    for req, ell, m in zip(log.request, log.ell, log.accepted, strict=True):
        out = res.token_ids[req]
        s = start[req] + 1  # token 0 of the answer comes from the prefill
        for k in range(min(ell, m + 1)):
            pos_n[k] += 1
            pos_ok[k] += int(k < m)
        b = max(x for x in BINS[:-1] if x <= s - 1) if s - 1 < BINS[-1] else None
        if b is not None and ell:
            bin_acc[b][0] += 1
            bin_acc[b][1] += m
            bin_acc[b][2] += int(m >= 1)
        if m < ell and s + m < len(out):
            tok = out[s + m]
            kinds[token_kind(target.tokenizer.convert_ids_to_tokens(tok), tok in special)] += 1
        start[req] += m + 1
    for out in res.token_ids:
        for tok in out:
            kinds_all[token_kind(target.tokenizer.convert_ids_to_tokens(tok), tok in special)] += 1
    answer = torch.tensor([t for out in res.token_ids for t in out], dtype=torch.long)
    outside = {name: round(float((~torch.isin(answer, ids)).float().mean()), 4) for name, ids in vocabs.items()}
    rejections = sum(kinds.values())
    total = sum(kinds_all.values())
    return {
        "tau": res.stats.tau,
        "A_k": [round(o / n, 4) if n else None for o, n in zip(pos_ok, pos_n, strict=True)],
        "S_k": [None if v is None else round(v, 4) for v in res.stats.survival],
        "by_answer_position": {
            f"{b}-{BINS[BINS.index(b) + 1] - 1}": {
                "rounds": r,
                "mean_accepted": round(a / r, 3) if r else None,
                "A_1": round(f / r, 3) if r else None,
            }
            for b, (r, a, f) in bin_acc.items()
        },  # fmt: skip
        "outside_vocab": outside,
        "rejected_kind": {k: round(kinds[k] / rejections, 3) for k in KINDS if kinds[k]},
        "answer_kind": {k: round(kinds_all[k] / total, 3) for k in KINDS if kinds_all[k]},
        "rejection_rate_by_kind": {k: round(kinds[k] / kinds_all[k], 3) for k in KINDS if kinds_all[k]},
        "answer_tokens": total,
        "rounds": len(log.ell),
    }


def markdown(doc: dict) -> str:
    sets = doc["sets"]
    names = list(sets)
    g = len(next(iter(sets.values()))["A_k"])
    lines = [f"CPU {doc['cpu']}, commit {doc['commit']}, {doc['date']}; T = 0, static γ = {doc['gamma']}, "
             f"{doc['max_new_tokens']} new tokens, {doc['per_set']} held-out prompts per set", "",
             "| set | τ | " + " | ".join(f"A_{k + 1}" for k in range(g)) + " |",
             "|---|---|" + "---|" * g]  # fmt: skip
    for s in names:
        a = sets[s]["A_k"]
        lines.append(
            f"| {s} | {sets[s]['tau']:.2f} | " + " | ".join("—" if x is None else f"{x:.2f}" for x in a) + " |"
        )
    bins = list(sets[names[0]]["by_answer_position"])
    lines += ["", "Acceptance by answer position (mean accepted drafts per round, A_1):", "",
              "| set | " + " | ".join(bins) + " |", "|---|" + "---|" * len(bins)]  # fmt: skip
    for s in names:
        cells = []
        for b in bins:
            x = sets[s]["by_answer_position"][b]
            cells.append("—" if not x["rounds"] else f"{x['mean_accepted']:.2f}, {x['A_1']:.2f} ({x['rounds']})")
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    vocabs = list(sets[names[0]]["outside_vocab"])
    lines += ["", "Share of the target's answer tokens outside a draft vocabulary:", "",
              "| set | " + " | ".join(vocabs) + " |", "|---|" + "---|" * len(vocabs)]  # fmt: skip
    for s in names:
        lines.append(f"| {s} | " + " | ".join(f"{100 * sets[s]['outside_vocab'][v]:.1f} %" for v in vocabs) + " |")
    lines += ["", "What the target picked where the first draft failed (share of rejections; in brackets: how often "
              "a token of that kind, anywhere in the answers, is a rejection point):", "",
              "| set | " + " | ".join(KINDS) + " |", "|---|" + "---|" * len(KINDS)]  # fmt: skip
    for s in names:
        rk, rr = sets[s]["rejected_kind"], sets[s]["rejection_rate_by_kind"]
        lines.append(f"| {s} | " + " | ".join(f"{100 * rk.get(k, 0):.0f} % ({rr.get(k, 0):.2f})" for k in KINDS) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--heldout", required=True, help="the recipe's <work_dir>/responses_heldout.jsonl")
    ap.add_argument("--train", required=True, help="the recipe's <work_dir>/responses_train.jsonl")
    ap.add_argument("--per_set", type=int, default=30)
    ap.add_argument("--gamma", type=int, default=7)
    ap.add_argument("--max_new_tokens", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8, help="prompts per call (greedy rounds do not depend on it)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/data/chat_diagnosis"))
    a = ap.parse_args()

    target, (drafter,) = load_target_and_drafters(None, [a.drafter])
    V = target.geometry.vocab_size
    counts = answer_counts(Path(a.train), target, V)
    vocabs = {"drafter's": drafter.draft_vocab.cpu()} if drafter.draft_vocab is not None else {}
    vocabs |= {f"top {n // 1024} k": frequent_tokens(counts, n, target.stop_token_ids) for n in (8192, 16384, 32768)}
    sets = heldout_prompts(a.heldout, a.per_set)
    out = {}
    for name, prompts in sets.items():
        res = decode(target, drafter, prompts, max_new_tokens=a.max_new_tokens, temperature=0.0,
                     scheduler={"class_path": "static", "init_args": {"gamma": a.gamma}}, batch_size=a.batch,
                     progress=True)  # fmt: skip
        out[name] = analyse(res, target, drafter.block_size, vocabs)
        print(name, json.dumps({k: out[name][k] for k in ("tau", "A_k", "outside_vocab")}), flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    doc = {"command": "benchmarks/chat_diagnosis.py " + " ".join(f"--{k} {v}" for k, v in vars(a).items()),
           "cpu": cpu_model(), "commit": commit.strip(), "date": datetime.date.today().isoformat(),
           "gamma": a.gamma, "max_new_tokens": a.max_new_tokens, "per_set": a.per_set, "sets": out}  # fmt: skip
    dest = Path(a.out)
    dest.mkdir(parents=True, exist_ok=True)
    atomic_write(dest / "chat_diagnosis.json", json.dumps(doc, indent=1) + "\n")
    atomic_write(dest / "chat_diagnosis.md", markdown(doc) + "\n")
    print(f"-> {dest}")


if __name__ == "__main__":
    main()
