"""Peak CPU memory of one loss forward + backward, unchunked (as before) against chunked (docs/training.md).

    .venv/bin/python benchmarks/loss_memory.py --blocks 128 --gamma 7 --vocab 32768 --hidden 256 --chunk 16

Each case runs in a fresh process with glibc's mmap threshold at 64 KiB, so every tensor of that size or more is
mapped on allocation and unmapped on free and the resident memory follows the live tensors. The number is the peak
resident memory (ru_maxrss) minus the resident memory once the inputs and the draft logits exist: what the loss
itself adds (its tensors, saved activations and gradients).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys

import torch


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def run_case(blocks: int, gamma: int, vocab: int, hidden: int, chunk: int | None) -> dict:
    """One loss step; ``chunk`` None = the unchunked loss with materialised target logits (the old path)."""
    from dspark_lightning.losses import ProjectedLogits, dspark_loss, position_weights

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(hidden, vocab, bias=False).requires_grad_(False)
    proj = torch.nn.Parameter(torch.randn(hidden, hidden, generator=g) / hidden**0.5)
    h_draft, h_target = torch.randn(2, blocks, gamma, hidden, generator=g)
    labels = torch.randint(0, vocab, (blocks, gamma), generator=g)
    mask, w = torch.ones(blocks, gamma), position_weights(gamma)
    conf = torch.zeros(blocks, gamma, requires_grad=True)
    logits = head(h_draft @ proj)  # (N, γ, V): what the drafter hands to the loss
    base = _rss_mib()
    if chunk is None:
        with torch.no_grad():
            target = head(h_target)
    else:
        target = ProjectedLogits(h_target, head)
    terms = dspark_loss(logits, target, labels, mask, w, conf, chunk_size=chunk)
    terms.total.backward()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base
    return {"chunk": chunk, "loss": float(terms.total), "peak_mib": round(peak, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=128, help="anchor blocks N (batch x anchors)")
    ap.add_argument("--gamma", type=int, default=7)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--chunk", type=int, nargs="+", default=[16], help="chunk sizes to measure")
    ap.add_argument("--case", type=str, default=None, help=argparse.SUPPRESS)  # one case, in a child process
    a = ap.parse_args()
    if a.case is not None:
        chunk = None if a.case == "none" else int(a.case)
        print(json.dumps(run_case(a.blocks, a.gamma, a.vocab, a.hidden, chunk)))
        return
    mib = a.blocks * a.gamma * a.vocab * 4 / 2**20
    print(f"N = {a.blocks} blocks, γ = {a.gamma}, V = {a.vocab}: one fp32 (N·γ × V) tensor = {mib:.1f} MiB")
    print("| chunk_size | peak over inputs (MiB) | in fp32 (N·γ × V) tensors | loss |")
    print("|---|---|---|---|")
    for case in ["none", *map(str, a.chunk)]:
        cmd = [sys.executable, __file__, *sys.argv[1:], "--case", case]
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
        r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout)
        name = "unchunked" if case == "none" else case
        print(f"| {name} | {r['peak_mib']} | {r['peak_mib'] / mib:.2f} | {r['loss']:.6f} |")


if __name__ == "__main__":
    main()
