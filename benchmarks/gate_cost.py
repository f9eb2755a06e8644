"""What `auto` costs where drafting never pays: plain decoding, an engine whose gate skips every step, and `auto`.

    .venv/bin/python benchmarks/gate_cost.py --drafter outputs/smollm2_dspark/tb/version_0/drafter \\
        --heldout outputs/smollm2_dspark/data/responses_heldout.jsonl --set chat      (make gate-cost)

Decodes (at ``--temperature``, 0 by default; T > 0 with ``--acceptance coupled`` emits plain's tokens in every method)
the first ``--prompts`` held-out prompts of one set in groups of ``--batch``, ``--repeats`` times, each group by
the three methods back to back (the order rotating). ``skip_all`` is ``auto`` whose gate never drafts: the drafter still
reads the prompt and every skipped step's features wait in the backlog, so it prices the bookkeeping of a gated engine
apart from its drafted steps. Per method: tok/s, the speed ratio to plain with a 95 % bootstrap interval over the
(group, repeat) pairs, the engine's own time per stage (``DecodeStats.time_s``, seconds per call) and the drafted steps
per call, and the target's forward per step split by kind (``verify_ms``: a plain step's, a drafted step's, timed around
the engine's verify stage) beside the drafter's time per drafted step. Writes ``<out>/gate_cost_<set>_b<batch>.json``.
Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import subprocess
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from dspark_lightning.atomic import atomic_write  # noqa: E402
from dspark_lightning.checkpoint import load_target_and_drafters  # noqa: E402
from dspark_lightning.data.prompts.evalsets import heldout_prompts  # noqa: E402
from dspark_lightning.devices import cpu_model  # noqa: E402
from dspark_lightning.infer import decode  # noqa: E402
from dspark_lightning.infer import engine as engine_module  # noqa: E402
from dspark_lightning.infer.schedule.schedulers import AutoScheduler  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


class SkipAll(AutoScheduler):
    """``auto`` whose gate skips the drafter at every step."""

    def wants_draft(self, R: int) -> bool:
        return False


METHODS = {"plain": None, "skip_all": SkipAll, "auto": "auto"}
STEPS: list[tuple[bool, float]] = []  # (drafted, seconds of the verify stage) per engine step of the current call


def timed_verify(verify):
    """The engine's verify stage, timed per step into :data:`STEPS`."""

    def wrapper(self, batch, proposal, lengths):
        t0 = time.perf_counter()
        out = verify(self, batch, proposal, lengths)
        STEPS.append((proposal is not None, time.perf_counter() - t0))
        return out

    return wrapper


def ratio_interval(pairs: list[tuple[float, float]], n: int = 2000) -> list[float]:
    """95 % bootstrap interval of Σ plain seconds / Σ method seconds over (method s, plain s) pairs of equal tokens."""
    g, draws = random.Random(0), []
    for _ in range(n):
        idx = [g.randrange(len(pairs)) for _ in pairs]
        draws.append(sum(pairs[i][1] for i in idx) / sum(pairs[i][0] for i in idx))
    draws.sort()
    return [round(draws[int(0.025 * n)], 3), round(draws[int(0.975 * n) - 1], 3)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--heldout", required=True)
    ap.add_argument("--set", default="chat")
    ap.add_argument("--prompts", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--max_new_tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--acceptance", default="rejection", help="coupled at T > 0: every method emits plain's tokens")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/data/gate_cost"))
    a = ap.parse_args()

    engine_module.Engine._verify = timed_verify(engine_module.Engine._verify)
    target, (drafter,) = load_target_and_drafters(None, [a.drafter])
    prompts = heldout_prompts(a.heldout, a.prompts, (a.set,))[a.set]
    groups = [prompts[i : i + a.batch] for i in range(0, len(prompts), a.batch)]
    for name in ("auto", "static"):  # one-time profiles before any timing
        decode(target, drafter, groups[0], max_new_tokens=8, scheduler=name, batch_size=a.batch,
               temperature=a.temperature, acceptance=a.acceptance)  # fmt: skip
    names = list(METHODS)
    acc = {n: {"s": 0.0, "tokens": 0, "calls": [], "drafted": 0, "time_s": {}, "steps": []} for n in names}
    k = 0
    for _ in range(a.repeats):
        for group in groups:
            k += 1
            for name in names[k % 3 :] + names[: k % 3]:
                sched = METHODS[name]
                scheduler = "static" if sched is None else sched() if isinstance(sched, type) else sched
                STEPS.clear()
                t0 = time.perf_counter()
                res = decode(target, None if sched is None else drafter, group, max_new_tokens=a.max_new_tokens,
                             scheduler=scheduler, batch_size=a.batch, temperature=a.temperature,
                             acceptance=a.acceptance)  # fmt: skip
                seconds = time.perf_counter() - t0
                x = acc[name]
                x["s"] += seconds
                x["tokens"] += res.stats.generated_tokens
                x["calls"].append(seconds)
                x["steps"] += STEPS
                x["drafted"] += res.stats.steps - res.stats.skipped_steps if sched is not None else 0
                for stage, v in res.stats.time_s.items():
                    x["time_s"][stage] = x["time_s"].get(stage, 0.0) + v
    calls = len(acc["plain"]["calls"])
    plain_rate = acc["plain"]["tokens"] / acc["plain"]["s"]
    rows = []
    for name, x in acc.items():
        rate = x["tokens"] / x["s"]
        row = {"method": name, "tok_s": round(rate, 2), "vs_plain": round(rate / plain_rate, 3),
               "drafted_steps_per_call": round(x["drafted"] / calls, 1),
               "time_s_per_call": {k: round(v / calls, 4) for k, v in x["time_s"].items()}}  # fmt: skip
        for kind, drafted in (("plain_step", False), ("drafted_step", True)):
            times = [s for d, s in x["steps"] if d is drafted]
            if times:
                row.setdefault("verify_ms", {})[kind] = round(1000 * sum(times) / len(times), 2)
        if x["drafted"]:
            row["draft_ms_per_drafted_step"] = round(1000 * x["time_s"].get("draft", 0.0) / x["drafted"], 2)
        if name != "plain" and x["tokens"] == acc["plain"]["tokens"]:  # greedy: the same tokens per call
            row["vs_plain_ci"] = ratio_interval(list(zip(x["calls"], acc["plain"]["calls"], strict=True)))
        rows.append(row)
        print(json.dumps(row), flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    doc = {"command": "benchmarks/gate_cost.py " + " ".join(f"--{k} {v}" for k, v in vars(a).items()),
           "cpu": cpu_model(), "commit": commit.strip(), "date": datetime.datetime.now().isoformat(timespec="minutes"),
           "calls_per_method": calls, "rows": rows}  # fmt: skip
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = f"_T{a.temperature:g}_{a.acceptance}" if a.temperature > 0 else ""
    path = out / f"gate_cost_{a.set}_b{a.batch}{tag}.json"
    atomic_write(path, json.dumps(doc, indent=1) + "\n")
    print(f"-> {path}")


if __name__ == "__main__":
    main()
