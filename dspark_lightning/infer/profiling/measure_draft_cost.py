"""The drafter's cost per round (:class:`~dspark_lightning.infer.schedule.draft_cost.DraftCost`), measured once per
(drafter, target, machine) and cached next to the SPS table.

:func:`profile_draft_cost` times the drafter's work per step on synthetic prompts at the batch sizes a call can
reach; :func:`load_or_profile_draft_cost` reads the cached profile of an
exported drafter (profiling it on first use). ``decode()``'s setup calls it for a scheduler that models a step's
time (:class:`~dspark_lightning.infer.protocols.SPSDriven`) and hands it the result, outside the decoding loop.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import torch

from ...atomic import atomic_write
from ..acceptance.sampling import SamplingParams
from ..build import make_engine
from ..schedule.draft_cost import DraftCost
from .busy import OtherLoad, too_busy
from .measure_sps import default_path

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)
ROUNDS = 8  # timed steps per batch size and kind (after one untimed turn), their median


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


def sampling_kind(params: SamplingParams, acceptance: Any = "rejection") -> str:
    """What a step's sampling costs depend on: ``greedy``, or the acceptance mode drawing at T > 0 (``rejection``,
    ``coupled``, a plugin's name): coupled acceptance draws noise over the vocabulary at every verified position,
    which the greedy steps never pay."""
    if params.greedy:
        return "greedy"
    name = acceptance.get("class_path") if isinstance(acceptance, dict) else acceptance
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name if isinstance(name, str) else type(acceptance).__name__)


def cost_path(target, key: str, kind: str = "greedy") -> Path:
    sps = default_path(target, 0)  # v6: per sampling kind
    return sps.parent / "draft_cost" / f"{key}-{sps.stem.removesuffix('-ctx0')}-{kind}-v6.json"


_MEMO: dict[tuple, DraftCost] = {}  # in-memory drafters: profiled once per process
_BUSY: dict[Path, DraftCost] = {}  # exported drafters' costs measured on a busy machine: this process's, never saved


WIDTHS = (1, 2, 3, 4, 7)  # drafts verified per request in the profiled drafted steps (up to the block size)
PROMPT = (
    "Explain step by step how to find the area of a triangle whose sides are 5, 12 and 13, and then write a "
    "short Python function that computes the area of any triangle from its three sides."
)


def profile_prompt(target) -> list[int]:
    """A natural request (chat-formatted) when the target has a tokenizer: its drafts are accepted as in serving, so
    the profiled steps pay what accepted drafts cost (committing them, extending the drafter's context) at a
    serving-like context; else (a test target without a tokenizer of its vocabulary) a fixed 256-token pattern."""
    V = target.geometry.vocab_size
    if getattr(target, "tokenizer", None) is not None:
        ids = target.encode_prompt(PROMPT, True)
        if ids and max(ids) < V:
            return ids
    return [(17 * i + 5) % max(V - 1, 1) for i in range(256)]


class _Width:
    """A scheduler verifying ``k`` drafts of every request (set between steps)."""

    def __init__(self) -> None:
        self.k = 1

    def __call__(self, conf: torch.Tensor) -> torch.Tensor:
        return torch.full((conf.shape[0],), self.k, dtype=torch.long)


def _profile_batch(target, drafter, prompt: list[int], R: int, rounds: int, params: SamplingParams,
                   acceptance: Any) -> tuple[float, float, list[float]]:  # fmt: skip
    """At R requests of ``prompt`` (sampled as served, no stop token): the median drafting seconds per step (the
    drafter's forward, its cache update and the scheduler, timed directly), the median plain step and the median
    drafted step at each width, whole steps as the engine runs them. The kinds take turns, ``rounds`` steps each
    after one untimed step, so a drift of the machine's speed reaches all of them alike."""
    g = drafter.block_size
    widths = [w for w in WIDTHS if w <= g]
    width = _Width()
    plain = make_engine(target, None, params, scheduler="static", stop_token_ids=[], acceptance=acceptance)
    drafted = make_engine(target, drafter, params, scheduler=width, stop_token_ids=[], acceptance=acceptance)
    plain.add([prompt] * R, rounds + 2)
    drafted.add([prompt] * R, (rounds + 1) * len(widths) * (g + 1) + 1)
    times: dict[object, list[float]] = {"plain": [], "draft": [], **{w: [] for w in widths}}
    for i in range(rounds + 1):
        for kind in ["plain", *widths]:
            engine = plain if kind == "plain" else drafted
            width.k = kind if kind != "plain" else 1
            before = engine.time_s["draft"] + engine.time_s["schedule"]
            t0 = time.perf_counter()
            engine.step()
            engine.settle_timings()
            if i:  # the first turn is the warm-up
                times[kind].append(time.perf_counter() - t0)
                if kind == widths[0]:
                    times["draft"].append(engine.time_s["draft"] + engine.time_s["schedule"] - before)

    def median(xs: list[float]) -> float:
        return sorted(xs)[len(xs) // 2]

    return median(times["draft"]), median(times["plain"]), [median(times[w]) for w in widths]


@torch.no_grad()
def profile_draft_cost(target, drafter, max_batch: int, progress: bool = False, kind: str = "greedy",
                       acceptance: Any = "rejection") -> DraftCost:  # fmt: skip
    """At 1, 2, 4, ... up to ``max_batch`` requests (:func:`profile_prompt`; ``kind`` ``greedy``, else sampled at T = 1
    with ``acceptance``, :func:`sampling_kind`): the seconds a drafted round costs
    beyond its verification forward (drafting the whole block, the cache update, scheduling; timed directly), and
    whole plain and drafted steps as the engine runs them (verifying 1, 2, 3, 4, 7 drafts per request), which the
    ``auto`` scheduler models a step's time with."""
    prompt = profile_prompt(target)
    batches = [b for b in BATCHES if b <= max(1, max_batch)]
    if batches[-1] < max_batch <= BATCHES[-1]:
        batches.append(max_batch)
    sizes = [1, *batches]
    if progress:
        from tqdm.auto import tqdm

        sizes = tqdm(sizes, desc="profiling the drafter's cost per round", unit="batch size")
    params = SamplingParams(0.0 if kind == "greedy" else 1.0)
    with OtherLoad() as load:
        rows = [_profile_batch(target, drafter, prompt, R, ROUNDS, params, acceptance) for R in sizes]
    rows = rows[1:]  # the first R = 1 is the warm-up
    meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "threads": torch.get_num_threads(), "rounds": ROUNDS,
            "sampling": kind, "others_cpu_share": load.share}  # fmt: skip
    return DraftCost(batches=batches, seconds=[r[0] for r in rows], meta=meta, plain=[r[1] for r in rows],
                     widths=[w for w in WIDTHS if w <= drafter.block_size], drafted=[r[2] for r in rows])  # fmt: skip


def load_or_profile_draft_cost(target, drafter, max_batch: int, progress: bool = True,
                               params: SamplingParams | None = None,
                               acceptance: Any = "rejection") -> DraftCost:  # fmt: skip
    """The cached cost of this exported drafter on this machine for the sampling ``params`` and ``acceptance`` a call
    serves (greedy when None; profiled on first use; re-profiled when a larger batch is needed); in-memory drafters
    are profiled once per process. A profile measured while other processes kept the CPUs busy serves this process
    only."""
    kind = sampling_kind(params or SamplingParams(0.0), acceptance)
    key = drafter_key(drafter)
    if key is None:
        memo = (id(drafter), id(target), kind)
        if memo in _MEMO and _MEMO[memo].batches[-1] >= max_batch:
            return _MEMO[memo]
        _MEMO[memo] = profile_draft_cost(target, drafter, max_batch, kind=kind, acceptance=acceptance)
        too_busy(_MEMO[memo].meta, "the drafter's cost", progress)
        return _MEMO[memo]
    path = cost_path(target, key, kind)
    if path in _BUSY and _BUSY[path].batches[-1] >= min(max_batch, BATCHES[-1]):
        return _BUSY[path]
    try:  # a missing or damaged cache file is measured again
        d = json.loads(path.read_text())
        if d["batches"][-1] >= min(max_batch, BATCHES[-1]):
            return DraftCost(list(d["batches"]), list(d["seconds"]), dict(d.get("meta", {})), d.get("plain"),
                             d.get("widths"), d.get("drafted"))  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        pass
    if progress:
        print(f"[dspark-lightning] profiling the drafter's cost per round (before decoding; cached in {path})")
    cost = profile_draft_cost(target, drafter, max_batch, progress=progress, kind=kind, acceptance=acceptance)
    if too_busy(cost.meta, "the drafter's cost", progress):
        _BUSY[path] = cost
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(cost.to_dict(), indent=1) + "\n")  # fsynced, replaced whole
    return cost
