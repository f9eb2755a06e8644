"""The drafter's cost per round, measured once per (drafter, target, machine) and cached: reproducible scheduling.

The hardware-aware schedulers and the draft gate weigh the drafting time of a step against the target's step
time. Reading this run's wall clock there makes ℓ (and with it how many random numbers acceptance draws)
depend on the machine's load, so the same seed would give different T > 0 output from run to run. Instead the
cost per round is profiled once, at the batch sizes the call can reach, with a short static decode of synthetic
prompts, and stored next to the SPS table; every later call reads the same numbers. Live timing stays available
as the schedulers' explicit ``timing="live"`` option (not reproducible).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)
ROUNDS = 4  # timed rounds per batch size (after one warm-up decode)
# what a drafted round costs beyond its verification forward: drafting (with the context-cache update), scheduling
# and the acceptance test over γ positions (a plain round's acceptance is one draw: counting all of it is conservative)
OVERHEAD = ("draft", "schedule", "accept")


@dataclass
class DraftCost:
    """Seconds a drafted round costs beyond its verification (proposal, context-cache update, scheduling,
    acceptance) at profiled batch sizes."""

    batches: list[int]
    seconds: list[float]
    meta: dict[str, Any] = field(default_factory=dict)

    def __call__(self, R: int) -> float:
        """Linear between profiled batch sizes, proportional to R beyond the largest."""
        b, s = self.batches, self.seconds
        if R <= b[0]:
            return s[0]
        for (b0, s0), (b1, s1) in zip(zip(b, s, strict=True), zip(b[1:], s[1:], strict=True), strict=False):
            if R <= b1:
                return s0 + (R - b0) / (b1 - b0) * (s1 - s0)
        return s[-1] * R / b[-1]

    def to_dict(self) -> dict[str, Any]:
        return {"batches": self.batches, "seconds": self.seconds, "meta": self.meta}


def drafter_key(drafter) -> str | None:
    """A stable identity of an exported drafter as it runs (its weights hash and, when not fp32, its precision:
    a bf16 round costs another time), None for one that only lives in memory."""
    src = getattr(drafter, "source_dir", None)
    if src is None:
        return None
    try:
        key = json.loads((Path(src) / "config.json").read_text())["weights_sha256"][:16]
    except (OSError, KeyError, ValueError):
        return None
    from ..devices import param_dtype

    dt = param_dtype(drafter)
    return key if dt in (None, torch.float32) else f"{key}-{str(dt).removeprefix('torch.')}"


def cost_path(target, key: str) -> Path:
    from .sps import default_path

    sps = default_path(target, 0)  # v2: drafting, scheduling and acceptance (v1 files held drafting alone)
    return sps.parent / "draft_cost" / f"{key}-{sps.stem.removesuffix('-ctx0')}-v2.json"


_MEMO: dict[tuple, DraftCost] = {}  # in-memory drafters: profiled once per process


@torch.no_grad()
def profile_draft_cost(target, drafter, max_batch: int, progress: bool = False) -> DraftCost:
    """Seconds a drafted round costs beyond its verification forward (``OVERHEAD``), at 1, 2, 4, ... up to
    ``max_batch`` requests (static γ, greedy, synthetic prompts of 64 tokens): the engine's own clocks divided by its
    rounds."""
    from .build import make_engine
    from .sampling import SamplingParams

    V = target.geometry.vocab_size
    prompt = [(17 * i + 5) % max(V - 1, 1) for i in range(64)]
    batches = [b for b in BATCHES if b <= max(1, max_batch)]
    if batches[-1] < max_batch <= BATCHES[-1]:
        batches.append(max_batch)
    seconds = []
    sizes = [1, *batches]
    if progress:
        from tqdm.auto import tqdm

        sizes = tqdm(sizes, desc="profiling the drafter's cost per round", unit="batch size")
    for R in sizes:  # the first R = 1 is a warm-up
        engine = make_engine(target, drafter, SamplingParams(0.0), scheduler="static", stop_token_ids=[])
        engine.add([prompt] * R, ROUNDS + 1)
        start = sum(engine.time_s[k] for k in OVERHEAD)
        rounds = 0
        while engine.active and rounds < ROUNDS:
            engine.step()
            rounds += 1
        engine.settle_timings()  # on a GPU the drafting intervals are read off the device's timeline
        seconds.append((sum(engine.time_s[k] for k in OVERHEAD) - start) / max(rounds, 1))
    meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "threads": torch.get_num_threads(), "rounds": ROUNDS}
    return DraftCost(batches=batches, seconds=seconds[1:], meta=meta)


def load_or_profile_draft_cost(target, drafter, max_batch: int, progress: bool = True) -> DraftCost:
    """The cached cost of this exported drafter on this machine (profiled on first use; re-profiled when a
    larger batch is needed); in-memory drafters are profiled once per process."""
    key = drafter_key(drafter)
    if key is None:
        memo = (id(drafter), id(target))
        if memo not in _MEMO or _MEMO[memo].batches[-1] < max_batch:
            _MEMO[memo] = profile_draft_cost(target, drafter, max_batch)
        return _MEMO[memo]
    path = cost_path(target, key)
    if path.is_file():
        d = json.loads(path.read_text())
        if d["batches"][-1] >= min(max_batch, BATCHES[-1]):
            return DraftCost(d["batches"], d["seconds"], d.get("meta", {}))
    if progress:
        print(f"[dspark-lightning] profiling the drafter's cost per round (once, before decoding; cached in {path})")
    cost = profile_draft_cost(target, drafter, max_batch, progress=progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(cost.to_dict(), indent=1) + "\n")
    tmp.replace(path)
    return cost
