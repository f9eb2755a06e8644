"""The memory-bound floor of a verification step, and how close a measured step comes to it.

At batch 1 a small target's step is memory-bound: every weight is read once per forward whatever the number of
new tokens B (a few rows of compute per weight byte), plus the KV cache of the context. The floor is those bytes over
this machine's read bandwidth; a measured step time over the floor says how much of the step is something else
(kernels that do not stream at full bandwidth, per-op overhead, attention). ``dspark-lightning profile`` prints it
for every B it times.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

BANDWIDTH_BYTES = 256 << 20  # the buffer read to measure bandwidth: far larger than any CPU cache


def memory_bandwidth(nbytes: int = BANDWIDTH_BYTES, repeats: int = 7, device: torch.device | None = None) -> float:
    """Read bandwidth in bytes per second: the best of ``repeats`` full reductions over an ``nbytes`` fp32 buffer
    with torch's own threads (the ones the forward uses)."""
    device = device or torch.device("cpu")
    buf = torch.ones(nbytes // 4, device=device)
    best = float("inf")
    for _ in range(repeats + 1):
        _sync(device)
        t0 = time.perf_counter()
        buf.sum()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best


@dataclass
class StepBytes:
    """Bytes a verification step must read: the weights (once per step) and the KV cache (per cached token)."""

    weights: int
    kv_per_token: int

    def at(self, context: int, new: int) -> int:
        return self.weights + self.kv_per_token * (context + new)


def step_bytes(target) -> StepBytes:
    """The target's streamed bytes: decoder layers, final norm and LM head (the input embedding is a gather of B
    rows, not a stream), and its K/V per cached token."""
    dec = target.decoder
    params = {id(p): p for p in dec.layers.parameters()}
    params.update({id(p): p for p in dec.norm.parameters()})
    head = target.lm_head.weight
    params[id(head)] = head
    weights = sum(p.numel() * p.element_size() for p in params.values())
    g = target.geometry
    kv = 2 * g.num_layers * g.num_kv_heads * g.head_dim * head.element_size()
    return StepBytes(weights=weights, kv_per_token=kv)


def roofline_rows(times_s: dict[int, float], nbytes: StepBytes, bandwidth: float, context: int) -> list[dict]:
    """Per B: bytes read, the floor (bytes / bandwidth), the measured time and measured / floor."""
    rows = []
    for B, t in sorted(times_s.items()):
        b = nbytes.at(context, B)
        floor = b / bandwidth
        rows.append({"B": B, "mb": round(b / 1e6, 1), "floor_ms": round(floor * 1e3, 2),
                     "ms": round(t * 1e3, 2), "x_floor": round(t / floor, 2)})  # fmt: skip
    return rows


def roofline_text(rows: list[dict], nbytes: StepBytes, bandwidth: float, context: int) -> str:
    lines = [f"roofline: {nbytes.weights / 1e6:.1f} MB of weights a step + {nbytes.kv_per_token * context / 1e6:.1f} "
             f"MB of KV ({context} cached tokens); read bandwidth measured {bandwidth / 1e9:.1f} GB/s",
             "     B   bytes MB   floor ms   step ms   x floor   vs B=1"]  # fmt: skip
    base = rows[0]["ms"] if rows else 1.0
    for r in rows:
        lines.append(f"  {r['B']:4d}   {r['mb']:8.1f}   {r['floor_ms']:8.2f}   {r['ms']:7.2f}   {r['x_floor']:7.2f}"
                     f"   {r['ms'] / base:6.2f}")  # fmt: skip
    return "\n".join(lines)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
