"""Target steps per second SPS(B) as a function of the total verification tokens B (docs/algorithm.md §6).

:func:`~.profiling.measure_sps.profile_sps` times the target's verification forward on this machine: B new tokens over a
context of ``context_len`` cached tokens (the flat batching's cost model), warmup plus the median of repeats,
SPS(B) = 1 / median. The :class:`SPSTable` here keeps the raw measurements and a non-increasing smoothed curve
(pool-adjacent-violators), which the scheduler uses; it interpolates linearly between profiled points, and a B above
the profiled maximum is inadmissible (SPS = 0).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ...atomic import atomic_write
from ...checks import UsageError

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
            raise UsageError("an SPS table's tokens and sps must be lists of numbers")
        if not self.tokens or len(self.tokens) != len(self.sps):
            raise UsageError("an SPS table needs equally many token counts and SPS values (at least one)")
        bad = [b for b in self.tokens if isinstance(b, bool) or not isinstance(b, int) or b < 1]
        if bad:
            raise UsageError(f"SPS table token counts must be integers >= 1, got {bad[:3]}")
        bad = [v for v in self.sps if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)
               or v <= 0]  # fmt: skip
        if bad:
            raise UsageError(f"SPS table steps per second must be finite numbers > 0, got {bad[:3]}")
        if any(b <= a for a, b in zip(self.tokens, self.tokens[1:], strict=False)):
            raise UsageError("SPS table token counts must be strictly increasing")
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
            raise UsageError(f"{path}: an SPS table is a JSON object with 'tokens' and 'sps' lists")
        meta = d.get("meta", {})
        meta = meta if isinstance(meta, dict) else {}
        return cls(tokens=d["tokens"], sps=d["sps"], raw_sps=d.get("raw_sps", []), meta=meta)

    @classmethod
    def from_points(cls, points: dict[int, float], **meta: Any) -> SPSTable:
        """A table from {B: SPS} (tests, hand-made curves); no smoothing."""
        b = sorted(points)
        s = [float(points[k]) for k in b]
        return cls(tokens=b, sps=s, raw_sps=s, meta=meta)
