"""Measuring the target's steps per second SPS(B) on this machine (an :class:`~..sps.SPSTable`), cached per target,
device, dtype, verifier and context length (:func:`default_path`)."""

from __future__ import annotations

import re
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from ...checks import UsageError
from ...devices import device_tag
from ..schedule.sps import DEFAULT_GRID, SPSTable, nonincreasing
from .busy import OtherLoad, too_busy


def default_path(target, context_len: int) -> Path:
    from ...targets import cache_root

    dev = next(target.model.parameters())
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", str(target.name))
    dtype = str(dev.dtype).split(".")[-1]
    from ..verify.kernels import VERSION
    from ..verify.lean import lean_unsupported

    # the verifier decode() picks by default; the lean one's steps depend on the kernel choice, so its version too
    impl = f"lean-k{VERSION}" if lean_unsupported(target) is None else "hf"
    return cache_root() / "sps" / f"{name}-{device_tag(dev.device)}-{dtype}-{impl}-ctx{context_len}.json"


@torch.no_grad()
def profile_sps(
    target,
    grid: tuple[int, ...] | list[int] = DEFAULT_GRID,
    max_tokens: int | None = None,
    context_len: int = 512,
    repeats: int = 5,
    warmup: int = 2,
    progress: bool = True,
    verifier: str = "auto",
) -> SPSTable:
    """Time the target's verification forward for every B in ``grid`` (up to ``max_tokens``), with the verifier
    ``decode()`` uses (``auto``: the lean forward where it supports the target)."""
    from ..verify.hf import build_verifier

    points = [b for b in grid if max_tokens is None or b <= max_tokens]
    if not points:
        raise UsageError(f"no grid point is <= max_tokens={max_tokens}")
    dev = next(target.model.parameters()).device
    V = target.geometry.vocab_size
    gen = torch.Generator().manual_seed(0)
    one = torch.tensor([0], device=dev)
    v = build_verifier(verifier, target, batching="padded")  # one request: padded == flat
    v.prefill([0], [torch.randint(0, V, (context_len,), generator=gen).tolist()])
    times: list[float] = []
    with OtherLoad() as load:
        for B in _bar(points, progress, f"profiling SPS of {target.name}"):
            samples = []
            for i in range(warmup + repeats):
                toks = torch.randint(0, V, (1, B), generator=gen).to(dev)
                _sync(dev)
                t0 = time.perf_counter()
                out = v.forward([0], toks, torch.tensor([B], device=dev), torch.tensor([context_len], device=dev))
                v.logits(out.hidden).float().softmax(-1)
                _sync(dev)
                if i >= warmup:
                    samples.append(time.perf_counter() - t0)
                v.commit(one, torch.tensor([context_len - 1], device=dev))  # roll back, as after a full rejection
            times.append(sorted(samples)[len(samples) // 2])
    raw = [1.0 / t for t in times]
    meta = {
        "target": str(target.name),
        "device": device_tag(dev),
        "dtype": str(next(target.model.parameters()).dtype).split(".")[-1],
        "threads": torch.get_num_threads(),
        "verifier": type(v).__name__,
        "context_len": context_len,
        "repeats": repeats,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "others_cpu_share": load.share,
    }
    return SPSTable(tokens=points, sps=nonincreasing(raw), raw_sps=raw, meta=meta)


_PROFILING = threading.Lock()  # one profile at a time: threads decoding together would time each other's work
_BUSY: dict[Path, SPSTable] = {}  # tables measured on a busy machine: this process's, never saved


def load_or_profile(target, context_len: int = 512, max_tokens: int | None = None, progress: bool = True) -> SPSTable:
    """The cached table for this target and device, profiling it on first use (a thread arriving meanwhile waits,
    then reads the table just saved; one measured while other processes kept the CPUs busy serves this process only)."""
    path = default_path(target, context_len)
    with _PROFILING:
        for table in (_BUSY.get(path), SPSTable.load(path) if path.is_file() else None):
            if table is not None and (max_tokens is None or table.max_tokens >= max_tokens):
                return table
        table = profile_sps(target, max_tokens=max_tokens, context_len=context_len, progress=progress)
        if too_busy(table.meta, "the SPS table", progress):
            _BUSY[path] = table
        else:
            table.save(path)
    return table


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _bar(items, enabled: bool, desc: str):
    if not enabled:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, unit="B")
