"""The drafter's cost per round (:class:`~dspark_lightning.infer.schedule.draft_cost.DraftCost`), measured once per
(drafter, target, machine) and cached next to the SPS table.

:func:`profile_draft_cost` times the drafter's work per step on synthetic prompts at the batch sizes a call can
reach; :func:`load_or_profile_draft_cost` reads the cached profile of an
exported drafter (profiling it on first use). ``decode()``'s setup calls it for a scheduler that models a step's
time (:class:`~dspark_lightning.infer.protocols.SPSDriven`) and hands it the result, outside the decoding loop.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from ...atomic import atomic_write
from ..acceptance.sampling import SamplingParams
from ..build import make_engine
from ..schedule.draft_cost import DraftCost
from .measure_sps import default_path

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)
ROUNDS = 16  # timed steps per batch size (after one untimed step), their median


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
    from ...devices import param_dtype

    dt = param_dtype(drafter)
    return key if dt in (None, torch.float32) else f"{key}-{str(dt).removeprefix('torch.')}"


def cost_path(target, key: str) -> Path:
    sps = default_path(target, 0)  # v4: the drafter's own time per step, timed directly
    return sps.parent / "draft_cost" / f"{key}-{sps.stem.removesuffix('-ctx0')}-v4.json"


_MEMO: dict[tuple, DraftCost] = {}  # in-memory drafters: profiled once per process


def _draft_seconds(target, drafter, prompt: list[int], R: int, rounds: int) -> float:
    """Median drafting seconds per step (the drafter's forward, its cache update and the scheduler) over ``rounds``
    greedy steps of R requests verifying one draft each, after one untimed step. Timed directly, not as the
    difference of two whole steps: a step's noise on a shared CPU is larger than the drafter's cost."""
    engine = make_engine(target, drafter, SamplingParams(0.0), scheduler={"name": "static", "gamma": 1},
                         stop_token_ids=[])  # fmt: skip
    engine.add([prompt] * R, (rounds + 1) * (drafter.block_size + 1))
    engine.step()
    engine.settle_timings()
    times = []
    while engine.active and len(times) < rounds:
        before = engine.time_s["draft"] + engine.time_s["schedule"]
        engine.step()
        engine.settle_timings()
        times.append(engine.time_s["draft"] + engine.time_s["schedule"] - before)
    return sorted(times)[len(times) // 2]


@torch.no_grad()
def profile_draft_cost(target, drafter, max_batch: int, progress: bool = False) -> DraftCost:
    """Seconds a drafted round costs beyond its verification forward, at 1, 2, 4, ... up to ``max_batch`` requests:
    the drafter's work per step (drafting the whole block, the cache update, scheduling; greedy, a 256-token
    prompt), timed directly. The longer verification is the SPS table's part."""
    V = target.geometry.vocab_size
    prompt = [(17 * i + 5) % max(V - 1, 1) for i in range(256)]
    batches = [b for b in BATCHES if b <= max(1, max_batch)]
    if batches[-1] < max_batch <= BATCHES[-1]:
        batches.append(max_batch)
    seconds = []
    sizes = [1, *batches]
    if progress:
        from tqdm.auto import tqdm

        sizes = tqdm(sizes, desc="profiling the drafter's cost per round", unit="batch size")
    for R in sizes:  # the first R = 1 is a warm-up
        seconds.append(_draft_seconds(target, drafter, prompt, R, ROUNDS))
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
    try:  # a missing or damaged cache file is measured again
        d = json.loads(path.read_text())
        if d["batches"][-1] >= min(max_batch, BATCHES[-1]):
            return DraftCost(list(d["batches"]), list(d["seconds"]), dict(d.get("meta", {})))
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        pass
    if progress:
        print(f"[dspark-lightning] profiling the drafter's cost per round (once, before decoding; cached in {path})")
    cost = profile_draft_cost(target, drafter, max_batch, progress=progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(cost.to_dict(), indent=1) + "\n")  # fsynced, replaced whole: a reader never sees half
    return cost
