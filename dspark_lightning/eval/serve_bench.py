"""``dspark-lightning serve-bench``: a closed-loop serving study on this machine (the paper's Figures 7–8).

    dspark-lightning serve-bench --drafter outputs/compare/dspark/tb/version_0/drafter \
        --sps benchmarks/results/data/sps_smollm2_cpu.json --out benchmarks/results/data/serve_bench

For every concurrency N and every method (plain decoding, static γ, threshold, hardware-aware and its
asynchronous variant) one :class:`~dspark_lightning.infer.engine.Engine` really decodes: N requests are
active at all times and each finished request is replaced at once by the next prompt of the pool
(cycled). After the N first prefills and ``warmup_steps`` rounds, a window of ``window_s`` seconds
is measured:

- aggregate tok/s: tokens delivered by all requests in the window / window wall time (the prefills of
  replacement requests are inside the window: they are part of serving);
- per-user tok/s: tokens each request received after its first token, over the time it was active in
  the window after its first token, pooled over requests (TTFT excluded);
- verification length: mean ℓ per request-round, and mean B = Σ_r (1 + ℓ_r) per target forward;
- the time split (prefill, draft, schedule, verify, accept) inside the window.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ..checks import UsageError
from ..infer.schedule.schedulers import scheduler_spec

OUTPUT_FILES = {
    "serve_bench.json": "run info and one row per concurrency x method",
    "serve_bench.md": "the same as Markdown tables",
    "frontier.png": "aggregate tok/s against per-user tok/s, one line per method over concurrency",
    "budget.png": "mean verified drafts per request-round and per step against concurrency",
}
DEFAULT_METHODS = [
    "plain",
    *({"class_path": "static", "init_args": {"gamma": g}} for g in (1, 3, 5, 7)),
    {"class_path": "threshold", "init_args": {"threshold": 0.5}},
    "hardware_aware",
    "async_hardware_aware",
]


def method_text(method: Any) -> str:
    """A method as the command line gives it: its name, or its spec as one line of YAML."""
    if isinstance(method, str):
        return method
    import yaml

    return yaml.safe_dump(method, default_flow_style=True, width=10**6).strip()


def method_scheduler(method: Any, sps: Any = None) -> tuple[bool, Any]:
    """``plain`` (no drafter) or a scheduler spec as every command takes it (:func:`scheduler_spec`: a name or
    ``{class_path, init_args}``) -> (uses the drafter, scheduler spec); ``sps``: the table every scheduler that
    takes one gets."""
    if method == "plain":
        return False, "static"
    return True, scheduler_spec(method, sps)


def closed_loop(
    target,
    drafter,
    prompts: list[list[int]],
    *,
    concurrency: int,
    scheduler: Any = "static",
    temperature: float = 1.0,
    max_new_tokens: int = 64,
    window_s: float = 20.0,
    warmup_steps: int = 2,
    min_steps: int = 3,
    seed: int = 0,
    batching: str = "padded",
) -> dict:
    """Keep ``concurrency`` requests active for ``warmup_steps`` rounds, then measure a ``window_s`` window."""
    from ..infer.acceptance.sampling import SamplingParams
    from ..infer.decode import check_positions, make_engine
    from ..infer.profiling.measure_hardware import measure_hardware

    if concurrency < 1:
        raise UsageError(f"concurrency must be >= 1, got {concurrency}")
    if not prompts:
        raise UsageError("the prompt pool is empty")
    params = SamplingParams(temperature)
    engine = make_engine(target, drafter, params, scheduler=scheduler, seed=seed, batching=batching)
    check_positions(target, prompts, max_new_tokens, engine.block_size)
    engine.use_hardware(measure_hardware(engine, target, drafter, concurrency))
    added = 0

    def refill() -> None:
        nonlocal added
        while (room := concurrency - len(engine.active)) > 0:  # a prompt can finish at prefill: loop
            batch = [prompts[(added + i) % len(prompts)] for i in range(room)]
            engine.add(batch, max_new_tokens, first_index=added)
            added += room

    refill()
    for _ in range(warmup_steps):
        engine.step()
        refill()
    base = {r.rid: len(r.output) for r in engine.requests}  # tokens delivered before the window
    engine.settle_timings()
    n0, s0, time0 = len(engine.log.ell), len(engine.log.step_tokens), dict(engine.time_s)
    t0 = time.perf_counter()
    steps = 0
    while steps < min_steps or time.perf_counter() - t0 < window_s:
        engine.step()
        refill()
        steps += 1
    engine.settle_timings()  # (a GPU finishes the window's work before its clock is read)
    t1 = time.perf_counter()

    tokens, user_tokens, user_time = 0, 0, 0.0
    for r in engine.requests:
        before = base.get(r.rid, 0)
        tokens += len(r.output) - before
        first = max(before, 1)  # the first token (prefill) is TTFT, not per-user decoding speed
        start, end = max(t0, r.t_first), (r.t_done if r.done else t1)
        if end > start and len(r.output) > first:
            user_tokens += len(r.output) - first
            user_time += end - start
    ell, m = engine.log.ell[n0:], engine.log.accepted[n0:]
    step_b = engine.log.step_tokens[s0:]
    wall = t1 - t0
    split = {k: engine.time_s[k] - time0[k] for k in engine.time_s}
    return {
        "concurrency": concurrency,
        "window_s": wall,
        "steps": steps,
        "request_rounds": len(ell),
        "tokens": tokens,
        "aggregate_tok_s": tokens / wall,
        "per_user_tok_s": user_tokens / user_time if user_time > 0 else None,
        "mean_verify_len": sum(ell) / len(ell) if ell else 0.0,
        "mean_step_tokens": sum(step_b) / len(step_b) if step_b else 0.0,
        "tau": sum(engine.log.committed[n0:]) / len(ell) if ell else None,
        "acceptance_rate": sum(m) / sum(ell) if sum(ell) else None,
        "requests_started": len(engine.requests) - len(base),
        "requests_finished": sum(r.done and r.t_done >= t0 for r in engine.requests),
        "time_split_s": split,
        "draft_share": split["draft"] / wall,
        "verify_share": split["verify"] / wall,
    }


def serve_bench(
    target,
    drafter,
    prompts: list[str],
    *,
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16, 32),
    methods: list[Any] | None = None,
    sps: Any = None,
    temperature: float = 1.0,
    max_new_tokens: int = 64,
    window_s: float = 20.0,
    repeats: int = 1,
    seed: int = 0,
    batching: str = "padded",
    progress: bool = True,
) -> dict:
    """Every concurrency x method cell ``repeats`` times; the method order reverses at every other level and
    repeat. A row holds the mean over repeats of every number, and each repeat's tok/s in ``runs_*``."""
    from tqdm.auto import tqdm

    from .runner import run_info, scheduler_label, warmup

    given = list(methods or DEFAULT_METHODS)
    specs = {scheduler_label(m): method_scheduler(m, sps) for m in given}
    if len(specs) != len(given):
        raise UsageError(f"a method is given twice: {', '.join(scheduler_label(m) for m in given)}")
    methods = list(specs)
    if repeats < 1:
        raise UsageError(f"repeats must be >= 1, got {repeats}")
    if drafter is None and any(uses for uses, _ in specs.values()):
        raise UsageError("every method but 'plain' needs a drafter")
    ids = [target.encode_prompt(p) for p in prompts]
    warmup(target, {"d": drafter} if drafter is not None else {})
    runs: dict[tuple[int, str], list[dict]] = {}
    bar = tqdm(total=repeats * len(concurrency) * len(methods), desc="serve-bench", unit="cell", disable=not progress)
    for rep in range(repeats):
        for i, n in enumerate(concurrency):
            for method in methods if (i + rep) % 2 == 0 else methods[::-1]:  # drift hits every method alike
                bar.set_postfix_str(f"N={n} {method}")
                uses, sched = specs[method]
                row = closed_loop(target, drafter if uses else None, ids, concurrency=n, scheduler=sched,
                                  temperature=temperature, max_new_tokens=max_new_tokens, window_s=window_s,
                                  seed=seed + rep, batching=batching)  # fmt: skip
                runs.setdefault((n, method), []).append(row)
                bar.update()
    bar.close()
    rows = [{"method": m, **merge_runs(runs[(n, m)])} for n in concurrency for m in methods]
    add_step_costs(rows, sps)
    info = run_info(target, temperature=temperature, max_new_tokens=max_new_tokens, window_s=window_s, seed=seed,
                    repeats=repeats, batching=batching,
                    prompts=len(prompts), sps=None if sps is None else getattr(sps, "meta", None))  # fmt: skip
    return {"info": info, "methods": methods, "concurrency": list(concurrency), "rows": rows}


def add_step_costs(rows: list[dict], sps: Any = None) -> None:
    """Per-step drafting and verification milliseconds, and what the SPS table predicts for the mean B (the cost
    model Algorithm 1 uses), so a reader can see where the table and the engine disagree."""
    import torch

    for r in rows:
        steps = max(r["steps"], 1)
        r["draft_ms_per_step"] = 1000 * r["time_split_s"]["draft"] / steps
        r["verify_ms_per_step"] = 1000 * r["time_split_s"]["verify"] / steps
        if sps is not None:
            r["sps_table_ms"] = 1000 / float(sps(torch.tensor(r["mean_step_tokens"], dtype=torch.float64)))


def merge_runs(runs: list[dict]) -> dict:
    """Mean over repeats of every number (None stays None when any run has None); each run's tok/s kept."""

    def mean(xs):
        return None if any(x is None for x in xs) else sum(xs) / len(xs)

    out = {}
    for k, v in runs[0].items():
        if isinstance(v, dict):
            out[k] = {kk: mean([r[k][kk] for r in runs]) for kk in v}
        else:
            out[k] = mean([r[k] for r in runs])
    out["concurrency"] = runs[0]["concurrency"]
    out["runs_aggregate_tok_s"] = [r["aggregate_tok_s"] for r in runs]
    out["runs_per_user_tok_s"] = [r["per_user_tok_s"] for r in runs]
    return out


def write_serve_bench(doc: dict, out: str | Path) -> dict[str, Path]:
    from .report import plot_budget, plot_frontier, serve_markdown, write_outputs

    files = {"serve_bench.json": None, "serve_bench.md": serve_markdown, "frontier.png": plot_frontier,
             "budget.png": plot_budget}  # fmt: skip
    return write_outputs(doc, out, files)
