"""The floor of a verification step on this machine, and how close a measured step comes to it.

A step over B new tokens must read every weight once (plus the KV cache of its context) and compute
2 · B · (weights) flops (plus attention). Its floor is the larger of the two times on this machine: bytes over the
measured read bandwidth (the memory roof, binding at B = 1 for any model that does not fit in cache) and flops over
the measured matrix-product throughput (the compute roof, which B raises; on a CPU with few cores it binds within a
few tokens). A measured step over its floor says how much of the step is something else (kernels that do not stream
at full bandwidth, per-op overhead, attention). ``dspark-lightning profile`` prints it for every B it times.
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


def matmul_flops(n: int = 1024, repeats: int = 5, device: torch.device | None = None,
                 dtype: torch.dtype = torch.float32) -> float:  # fmt: skip
    """Matrix-product throughput in flop/s: the best of ``repeats`` n x n x n products (the compute roof), fewer when
    one product takes over a second (a dtype this device has no fast kernel for: more repeats only cost time)."""
    device = device or torch.device("cpu")
    a = torch.randn(n, n, device=device).to(dtype)
    best = float("inf")
    for _ in range(repeats + 1):
        _sync(device)
        t0 = time.perf_counter()
        a @ a
        _sync(device)
        best = min(best, time.perf_counter() - t0)
        if best > 1.0:
            break
    return 2 * n**3 / best


def best_matmul_flops(device: torch.device | None = None, dtype: torch.dtype = torch.float32,
                      sizes: tuple[int, ...] = (1024, 2048)) -> float:  # fmt: skip
    """The compute roof for a data stage: the best product throughput over a few sizes (a large forward's products
    reach the larger size's rate, which a single 1024-cube measurement can understate on a busy or throttled CPU)."""
    best = 0.0
    for n in sizes:
        flops = matmul_flops(n=n, repeats=5 if n <= 1024 else 3, device=device, dtype=dtype)
        best = max(best, flops)
        if 2 * n**3 / flops > 0.5:  # a slow dtype here: a larger product would take minutes to say the same
            break
    return best


def machine_roofs(device: torch.device, dtypes: set[torch.dtype] | list[torch.dtype]) -> tuple[dict[str, float], float]:
    """This machine's roofs for a data stage: the product throughput (flop/s) per dtype name and the read bandwidth
    (bytes/s), measured once per machine (device, CPU model, threads) and cached under the user cache
    (``roofs/<device tag>.json``), so reporting a preparation runs no benchmark after the first time. Delete the
    file to measure again."""
    import json

    from ...atomic import atomic_write
    from ...devices import device_tag
    from ...targets import cache_root

    path = cache_root() / "roofs" / f"{device_tag(device)}.json"
    try:
        doc = json.loads(path.read_text())
        flops, bandwidth = dict(doc["matmul_flops"]), float(doc["read_bandwidth"])
    except (OSError, ValueError, KeyError, TypeError):
        flops, bandwidth = {}, 0.0
    wanted = {str(d).removeprefix("torch."): d for d in dtypes}
    missing = {k: d for k, d in wanted.items() if k not in flops}
    if missing or not bandwidth > 0:
        flops.update({k: best_matmul_flops(device=device, dtype=d) for k, d in missing.items()})
        bandwidth = bandwidth if bandwidth > 0 else memory_bandwidth(device=device)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps({"matmul_flops": flops, "read_bandwidth": bandwidth}, indent=1) + "\n")
    return {k: flops[k] for k in wanted}, bandwidth


@dataclass
class StepBytes:
    """Bytes a verification step must read: the weights (once per step) and the KV cache (per cached token)."""

    weights: int
    kv_per_token: int
    params: int = 0  # weights in elements: 2 flops per element and new token
    attn_per_pair: int = 0  # attention flops per (new token, cached token) pair

    def at(self, context: int, new: int) -> int:
        return self.weights + self.kv_per_token * (context + new)

    def flops(self, context: int, new: int) -> int:
        return 2 * self.params * new + self.attn_per_pair * new * (context + new)


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
    attn = 4 * g.num_layers * g.num_heads * g.head_dim  # q·k and p·v, 2 flops each
    return StepBytes(weights=weights, kv_per_token=kv, params=sum(p.numel() for p in params.values()),
                     attn_per_pair=attn)  # fmt: skip


@dataclass
class Machine:
    """This machine's two roofs: read bandwidth (bytes/s) and matrix-product throughput (flop/s)."""

    bandwidth: float
    flops: float

    @classmethod
    def measure(cls, device: torch.device | None = None, dtype: torch.dtype = torch.float32) -> Machine:
        return cls(bandwidth=memory_bandwidth(device=device), flops=matmul_flops(device=device, dtype=dtype))


def roofline_rows(times_s: dict[int, float], nbytes: StepBytes, machine: Machine, context: int) -> list[dict]:
    """Per B: bytes read and flops, the memory and compute floors, the floor (the larger), the measured time and
    measured / floor."""
    rows = []
    for B, t in sorted(times_s.items()):
        mem = nbytes.at(context, B) / machine.bandwidth
        comp = nbytes.flops(context, B) / machine.flops
        floor = max(mem, comp)
        rows.append({"B": B, "mb": round(nbytes.at(context, B) / 1e6, 1),
                     "gflop": round(nbytes.flops(context, B) / 1e9, 2),
                     "memory_ms": round(mem * 1e3, 2), "compute_ms": round(comp * 1e3, 2),
                     "floor_ms": round(floor * 1e3, 2), "bound": "memory" if mem >= comp else "compute",
                     "ms": round(t * 1e3, 2), "x_floor": round(t / floor, 2)})  # fmt: skip
    return rows


def roofline_text(rows: list[dict], nbytes: StepBytes, machine: Machine, context: int) -> str:
    lines = [f"roofline: {nbytes.weights / 1e6:.1f} MB of weights a step + {nbytes.kv_per_token * context / 1e6:.1f} "
             f"MB of KV ({context} cached tokens); measured here: read bandwidth {machine.bandwidth / 1e9:.1f} GB/s, "
             f"matrix products {machine.flops / 1e9:.0f} GFLOP/s",
             "     B   memory ms   compute ms   floor ms   step ms   x floor   vs B=1"]  # fmt: skip
    base = rows[0]["ms"] if rows else 1.0
    for r in rows:
        lines.append(f"  {r['B']:4d}   {r['memory_ms']:9.2f}   {r['compute_ms']:10.2f}   {r['floor_ms']:8.2f}   "
                     f"{r['ms']:7.2f}   {r['x_floor']:7.2f}   {r['ms'] / base:6.2f}")  # fmt: skip
    return "\n".join(lines)


# --- the data stages ---------------------------------------------------------------------------------------------
def stage_roofline(target, stats: dict, machine_flops: dict[str, float], bandwidth: float,
                   regen_dtype: torch.dtype, concurrency: int) -> list[dict]:  # fmt: skip
    """How close each data stage of ``prepare`` came to this machine's roof (``prepare_stats.json``'s ``stats``).

    - regeneration prefills each prompt and decodes: per token run (prompt tokens, where the stage counted them, and
      new tokens) 2 flops per weight (plus attention over the context), a decode step reading the weights once for
      the ``concurrency`` requests it serves; its roof is the lower of the compute roof and ``concurrency`` tokens
      per weight read, in the regeneration dtype;
    - features are one prefill forward per conversation, decoder layers only (the cache holds the final-norm hidden
      states; the LM head runs at training time): compute-bound.
    Attention is counted over half the mean conversation length (the features' ``tokens / samples``).
    ``machine_flops``: matrix-product flop/s per dtype name; ``bandwidth``: read bytes/s."""
    nb = step_bytes(target)
    g = target.geometry
    head = g.vocab_size * g.hidden_size
    feats = [v for k, v in stats.items() if k.startswith("features_") and v.get("samples")]
    mean_len = sum(v["tokens"] for v in feats) / max(1, sum(v["samples"] for v in feats)) if feats else 256
    attn = nb.attn_per_pair * mean_len / 2
    rows = []
    for name, st in stats.items():
        if not isinstance(st, dict) or not st.get("tokens") or not (st.get("wall_s") or st.get("seconds")):
            continue
        if name.startswith("regenerate_"):
            dt = str(regen_dtype).removeprefix("torch.")
            per_tok = 2 * nb.params + attn
            weight_bytes = nb.params * torch.empty((), dtype=regen_dtype).element_size()
            compute = machine_flops[dt] / per_tok
            memory = concurrency * bandwidth / weight_bytes
            roof, bound = (compute, "compute") if compute <= memory else (memory, f"memory at {concurrency} requests")
        elif name.startswith("features_"):
            dt = str(target.dtype).removeprefix("torch.")
            per_tok = 2 * (nb.params - head) + attn
            roof, bound = machine_flops[dt] / per_tok, "compute"
        else:
            continue
        run = st["tokens"] + st.get("prompt_tokens", 0)  # regeneration: the prompts' prefill is target work too
        tok_s = run / (st.get("seconds") or st["wall_s"])
        rows.append({"stage": name, "dtype": dt, "tokens": int(run), "tok_s": round(tok_s, 1),
                     "gflop_per_tok": round(per_tok / 1e9, 3), "gflop_s": round(tok_s * per_tok / 1e9, 1),
                     "roof_tok_s": round(roof, 1), "of_roof": float(f"{tok_s / roof:.3g}"),
                     "bound": bound})  # fmt: skip
    return rows


def stage_text(rows: list[dict], machine_flops: dict[str, float], bandwidth: float) -> str:
    roofs = ", ".join(f"{k} {v / 1e9:.0f} GFLOP/s" for k, v in machine_flops.items())
    head = "  stage                 dtype      tokens     tok/s   GFLOP/tok   GFLOP/s   roof tok/s   of roof   bound"
    lines = [f"data stages against this machine's roof (matrix products: {roofs}; read bandwidth "
             f"{bandwidth / 1e9:.1f} GB/s):", head]  # fmt: skip
    for r in rows:
        lines.append(f"  {r['stage']:<20}  {r['dtype']:<8}  {r['tokens']:8d}  {r['tok_s']:8.1f}   "
                     f"{r['gflop_per_tok']:9.3f}   {r['gflop_s']:7.1f}   {r['roof_tok_s']:10.1f}   "
                     f"{r['of_roof']:6.1%}   {r['bound']}")  # fmt: skip
    return "\n".join(lines)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
