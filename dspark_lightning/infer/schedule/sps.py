"""Target steps per second SPS(B) as a function of the total verification tokens B (docs/algorithm.md §6).

:func:`profile_sps` times the target's verification forward on this machine: B new tokens over
a context of ``context_len`` cached tokens (the flat layout's cost model), warmup plus the median
of repeats, SPS(B) = 1 / median. The table keeps the raw measurements and a non-increasing
smoothed curve (pool-adjacent-violators), which the scheduler uses; it interpolates linearly
between profiled points, and a B above the profiled maximum is inadmissible (SPS = 0).
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from ...atomic import atomic_write
from ...devices import device_tag  # noqa: F401 - re-exported: the tag tables are keyed by

DEFAULT_GRID = (*range(1, 17), 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256)


def nonincreasing(values: list[float]) -> list[float]:
    """Least-squares non-increasing fit (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [sum, count]
    for v in values:
        blocks.append([v, 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] < blocks[-1][0] / blocks[-1][1]:
            s, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += c
    out: list[float] = []
    for s, c in blocks:
        out.extend([s / c] * int(c))
    return out


@dataclass
class SPSTable:
    tokens: list[int]  # profiled B, increasing
    sps: list[float]  # smoothed (non-increasing) steps per second, used by schedulers
    raw_sps: list[float] = field(default_factory=list)  # measured 1 / median forward time
    meta: dict[str, Any] = field(default_factory=dict)  # target, device, dtype, threads, context_len, date

    def __post_init__(self) -> None:
        if not isinstance(self.tokens, list | tuple) or not isinstance(self.sps, list | tuple):
            raise ValueError("an SPS table's tokens and sps must be lists of numbers")
        if not self.tokens or len(self.tokens) != len(self.sps):
            raise ValueError("an SPS table needs equally many token counts and SPS values (at least one)")
        bad = [b for b in self.tokens if isinstance(b, bool) or not isinstance(b, int) or b < 1]
        if bad:
            raise ValueError(f"SPS table token counts must be integers >= 1, got {bad[:3]}")
        bad = [v for v in self.sps if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)
               or v <= 0]  # fmt: skip
        if bad:
            raise ValueError(f"SPS table steps per second must be finite numbers > 0, got {bad[:3]}")
        if any(b <= a for a, b in zip(self.tokens, self.tokens[1:], strict=False)):
            raise ValueError("SPS table token counts must be strictly increasing")
        self._b = torch.tensor(self.tokens, dtype=torch.float64)
        self._s = torch.tensor(self.sps, dtype=torch.float64)

    @property
    def max_tokens(self) -> int:
        return self.tokens[-1]

    def __call__(self, B: torch.Tensor | float) -> torch.Tensor:
        """SPS at B (any shape), linear between profiled points; 0 above the profiled maximum."""
        B = torch.as_tensor(B, dtype=torch.float64)
        b, s = self._b, self._s
        i = torch.searchsorted(b, B.clamp(min=b[0]), right=True).clamp(1, len(b) - 1)
        lo, hi = b[i - 1], b[i]
        w = ((B - lo) / (hi - lo).clamp(min=1e-12)).clamp(0, 1) if len(b) > 1 else torch.zeros_like(B)
        out = s[i - 1] + w * (s[i] - s[i - 1]) if len(b) > 1 else s[0].expand_as(B)
        out = torch.where(B <= b[0], s[0], out)
        return torch.where(B > b[-1], torch.zeros_like(out), out)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if not k.startswith("_")}

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        return atomic_write(path, json.dumps(self.to_dict(), indent=2) + "\n")  # fsynced, replaced whole

    @classmethod
    def load(cls, path: str | Path) -> SPSTable:
        from ... import checks

        d = checks.read_json(path, "SPS table")
        if not isinstance(d, dict) or not {"tokens", "sps"} <= d.keys():
            raise ValueError(f"{path}: an SPS table is a JSON object with 'tokens' and 'sps' lists")
        meta = d.get("meta", {})
        meta = meta if isinstance(meta, dict) else {}
        return cls(tokens=d["tokens"], sps=d["sps"], raw_sps=d.get("raw_sps", []), meta=meta)

    @classmethod
    def from_points(cls, points: dict[int, float], **meta: Any) -> SPSTable:
        """A table from {B: SPS} (tests, hand-made curves); no smoothing."""
        b = sorted(points)
        s = [float(points[k]) for k in b]
        return cls(tokens=b, sps=s, raw_sps=s, meta=meta)


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
        raise ValueError(f"no grid point is <= max_tokens={max_tokens}")
    dev = next(target.model.parameters()).device
    V = target.geometry.vocab_size
    gen = torch.Generator().manual_seed(0)
    one = torch.tensor([0], device=dev)
    v = build_verifier(verifier, target, layout="padded")  # one request: padded == flat
    v.prefill([0], [torch.randint(0, V, (context_len,), generator=gen).tolist()])
    times: list[float] = []
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
    }
    return SPSTable(tokens=points, sps=nonincreasing(raw), raw_sps=raw, meta=meta)


_PROFILING = threading.Lock()  # one profile at a time: threads decoding together would time each other's work


def load_or_profile(target, context_len: int = 512, max_tokens: int | None = None, progress: bool = True) -> SPSTable:
    """The cached table for this target and device, profiling it on first use (a thread arriving meanwhile waits,
    then reads the table just saved)."""
    path = default_path(target, context_len)
    with _PROFILING:
        if path.is_file():
            table = SPSTable.load(path)
            if max_tokens is None or table.max_tokens >= max_tokens:
                return table
        table = profile_sps(target, max_tokens=max_tokens, context_len=context_len, progress=progress)
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
