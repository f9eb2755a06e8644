"""``dspark-lightning threshold-sweep``: the confidence-threshold trade-off (the paper's Figure 5).

    dspark-lightning threshold-sweep --drafter outputs/compare/dspark/tb/version_0/drafter \
        --out benchmarks/results/data/threshold_sweep

For every domain's held-out prompts and every θ, real decoding with the ``threshold`` scheduler: the
average verified drafts per request-round split into accepted (m) and rejected (ℓ − m), and the
acceptance rate α = Σ m / Σ ℓ (plotted only where at least ``report.MIN_DRAFTS_FOR_ALPHA`` drafts were verified:
above that θ almost no round verifies anything, and α of a handful of drafts is noise). ``--mode cumulative``
(default) cuts where the calibrated survival a_k falls below θ; ``--mode raw`` is the reference's rule on each
position's own raw confidence.
"""

from __future__ import annotations

from pathlib import Path

from ..checks import UsageError

OUTPUT_FILES = {
    "threshold_sweep.json": "run info and one row per domain x threshold",
    "threshold_sweep.md": "the same as a Markdown table",
    "threshold_sweep.png": "stacked accepted/rejected drafts per round and α against θ, one panel per domain",
}
DEFAULT_THRESHOLDS = [round(0.1 * i, 1) for i in range(10)]


def threshold_sweep(
    target,
    drafter,
    datasets,
    *,
    thresholds: list[float] = DEFAULT_THRESHOLDS,
    mode: str = "cumulative",
    temperature: float = 1.0,
    max_new_tokens: int = 64,
    batch_size: int = 8,
    calibrated: bool = True,
    seed: int = 0,
    progress: bool = True,
) -> dict:
    from tqdm.auto import tqdm

    from ..infer import decode
    from .runner import run_info

    if not thresholds or any(not 0 <= t <= 1 for t in thresholds):
        raise UsageError(f"thresholds must be in [0, 1], got {thresholds}")
    rows = []
    bar = tqdm(total=len(datasets) * len(thresholds), desc="threshold-sweep", unit="run", disable=not progress)
    for ds in datasets:
        for theta in thresholds:
            bar.set_postfix_str(f"{ds.domain} θ={theta:g}")
            res = decode(target, drafter, ds.prompts, max_new_tokens=max_new_tokens, temperature=temperature,
                         scheduler={"class_path": "threshold", "init_args": {"threshold": theta, "mode": mode}},
                         seed=seed, batch_size=batch_size, calibrated=calibrated)  # fmt: skip
            ell, m = res.log.ell, res.log.accepted
            n = len(ell)
            rows.append({
                "domain": ds.domain, "dataset": ds.name, "threshold": theta, "rounds": n,
                "verified_per_round": sum(ell) / n, "accepted_per_round": sum(m) / n,
                "rejected_per_round": (sum(ell) - sum(m)) / n,
                "verified_drafts": sum(ell),
                "acceptance_rate": sum(m) / sum(ell) if sum(ell) else None, "tau": res.stats.tau,
                "skipped_rounds": sum(e == 0 for e in ell) / n,
            })  # fmt: skip
            bar.update()
    bar.close()
    info = run_info(target, temperature=temperature, max_new_tokens=max_new_tokens, batch_size=batch_size, mode=mode,
                    calibrated=calibrated, seed=seed, prompts={d.name: len(d.prompts) for d in datasets})  # fmt: skip
    return {"info": info, "rows": rows}


def write_threshold_sweep(doc: dict, out: str | Path) -> dict[str, Path]:
    from .report import plot_threshold_sweep, sweep_markdown, write_outputs

    files = {"threshold_sweep.json": None, "threshold_sweep.md": sweep_markdown,
             "threshold_sweep.png": plot_threshold_sweep}  # fmt: skip
    return write_outputs(doc, out, files)
