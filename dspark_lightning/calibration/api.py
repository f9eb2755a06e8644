"""``calibrate()``: fit a drafter's STS confidence temperatures for one serving temperature and write them beside its
weights. The ``calibrate`` command and the export after ``fit`` (``--calibrate``) both call it."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from .. import checks, locks, registry
from ..atomic import atomic_write
from ..checkpoint import load_drafter_checked, load_target_and_drafters, read_config
from ..checkpoint.calibration import REJECTION
from ..checks import UsageError
from ..data.prompts.sources import DOMAINS
from ..devices import check_device_args
from ..infer.acceptance.sampling import SamplingParams
from .confidence import choose, frontier, report, report_markdown
from .files import load_rollouts, save_calibration
from .report import calibration_markdown, plot_reliability
from .rollouts import Rollouts, calibration_prompts, heldout_prompts
from .rollouts import rollouts as rollouts_of
from .sts import MIN_CLASS, MIN_ROWS, fit_sts, position_reports


def check_calibrate_args(
    drafter: str | Path,
    *,
    temperature: float,
    domains: Sequence[str],
    prompts_per_domain: int,
    heldout_fraction: float,
    max_new_tokens: int,
    batch_size: int,
    min_rows: int,
    min_class: int,
    report_dir: str | Path | None,
    device: str,
    prompts: str | Path | None = None,
    dtype: str,
    drafter_dtype: str | None,
    acceptance: str = REJECTION,
) -> None:
    """Every argument of :func:`calibrate` that can be checked before a model is loaded (named as the flags)."""
    checks.drafter_config(drafter)
    SamplingParams(temperature)  # the sampling law checks its own arguments
    if acceptance not in registry.names("acceptance"):
        raise UsageError(f"--acceptance {acceptance!r} is not one of {', '.join(registry.names('acceptance'))}")
    if acceptance != REJECTION and temperature == 0:
        raise UsageError(f"--acceptance {acceptance} at --temperature 0: greedy decoding accepts the same drafts in "
                         "every mode; calibrate T = 0 without --acceptance")  # fmt: skip
    for d in domains:
        if d not in DOMAINS:
            raise checks.UsageError(f"--domains {d!r} is not one of {', '.join(DOMAINS)}")
    checks.at_least("--prompts_per_domain", prompts_per_domain, 1)
    checks.in_range("--heldout_fraction", heldout_fraction, 0.0, 1.0)
    checks.at_least("--max_new_tokens", max_new_tokens, 1)
    checks.at_least("--batch_size", batch_size, 1)
    checks.at_least("--min_rows", min_rows, 0)
    checks.at_least("--min_class", min_class, 0)
    checks.output_dir("--report_dir", report_dir)
    if prompts is not None:
        checks.input_file("--prompts", prompts)
    check_device_args(device, dtype, drafter_dtype)


def calibrate(
    drafter: str | Path,
    *,
    temperature: float = 1.0,
    domains: Sequence[str] = DOMAINS,
    prompts_per_domain: int = 16,
    heldout_fraction: float = 0.5,
    max_new_tokens: int = 128,
    batch_size: int = 8,
    seed: int = 0,
    min_rows: int = MIN_ROWS,
    min_class: int = MIN_CLASS,
    report_dir: str | Path | None = None,
    rollouts: str | Path | None = None,
    prompts: str | Path | None = None,
    device: str = "auto",
    dtype: str = "auto",
    drafter_dtype: str | None = "auto",
    acceptance: str = REJECTION,
    target: Any = None,
    quiet: bool = False,
) -> Path:
    """Fit STS confidence temperatures of a drafter for one serving temperature; writes ``calibration_T<T>.json``
    (``calibration_T<T>_<mode>.json`` for another acceptance mode) beside its weights and returns that file.

    The rows are rounds of real speculative decoding with full-length verification on the STS pool's prompts
    (disjoint from training and from ``eval``); every 1/``heldout_fraction``-th prompt is kept out of the fit and
    scored after it. Holds the drafter folder's lock, so two calibrations never write the same files at once. The
    ``calibrate`` command's flags are generated from this signature.

    Args:
        drafter: exported drafter directory (the file is saved there)
        temperature: serving temperature the calibration is for
        domains: STS pool domains the prompts come from
        prompts_per_domain: STS pool prompts per domain
        heldout_fraction: prompts kept out of the fit and scored after
        max_new_tokens: most tokens generated per prompt
        batch_size: concurrent requests
        seed: random seed of the sampling
        min_rows: fewer rounds at a position: copy the previous T
        min_class: fewer surviving or failing rounds: copy the previous T
        report_dir: also write report JSON, PNGs and rollouts.pt
        rollouts: refit from a saved rollouts.pt (no decoding)
        prompts: a responses JSONL to draw the pool from (a recipe's <work_dir>/responses_heldout.jsonl: the prompts
            the drafter will serve); default: the built-in STS pool
        device: auto (CUDA when available) | cpu | cuda | cuda:N
        dtype: target: auto (bf16 on CUDA, fp32 on CPU) | bf16 | fp32
        drafter_dtype: drafter: auto (the faster of fp32/bf16 here) | bf16 | fp32
        acceptance: the acceptance mode whose rounds the maps are fitted on (T > 0): rejection, or coupled (what
            ``decode(..., acceptance="coupled")`` then reads, instead of mapping rejection-sampling confidences to
            the coupling's worst case)
        target: an already loaded target (default: the one the drafter records, on ``device`` in ``dtype``)
        quiet: print neither the table nor progress
    """
    check_calibrate_args(
        drafter, temperature=temperature, domains=domains, prompts_per_domain=prompts_per_domain,
        heldout_fraction=heldout_fraction, max_new_tokens=max_new_tokens, batch_size=batch_size, min_rows=min_rows,
        min_class=min_class, report_dir=report_dir, device=device, dtype=dtype, drafter_dtype=drafter_dtype,
        prompts=prompts, acceptance=acceptance,
    )  # fmt: skip
    lock = locks.folder_lock(drafter, "calibrate") if locks.is_primary_process() else contextlib.nullcontext()
    with lock:
        ro = load_rollouts(rollouts) if rollouts else None
        if target is None:
            target, (model,) = load_target_and_drafters(None, [drafter], dtype=dtype, device=device,
                                                        drafter_dtype=drafter_dtype)  # fmt: skip
        else:
            model = load_drafter_checked(drafter, target, drafter_dtype)
        checks.fits_positions(target, max_new_tokens + 1, "--max_new_tokens with a one-token prompt")
        pool = calibration_prompts(list(domains), prompts_per_domain, prompts)
        if not pool:
            raise checks.UsageError(f"--prompts {prompts} holds no prompt of the domains {', '.join(domains)}")
        if ro is None:
            flat = [text for texts in pool.values() for text in texts]
            ro = rollouts_of(target, model, flat, temperature=temperature, max_new_tokens=max_new_tokens, seed=seed,
                             batch_size=batch_size, acceptance=acceptance, progress=not quiet)  # fmt: skip
        return _fit_and_write(ro, model, drafter, temperature=temperature, acceptance=acceptance, pool=pool,
                              prompts_file=prompts,
                              prompts_per_domain=prompts_per_domain, heldout_fraction=heldout_fraction,
                              max_new_tokens=max_new_tokens, seed=seed, min_rows=min_rows, min_class=min_class,
                              report_dir=report_dir, save_rollouts=rollouts is None, quiet=quiet)  # fmt: skip


def _fit_and_write(
    ro: Rollouts, model: Any, drafter: str | Path, *, temperature: float, acceptance: str, pool: dict[str, list[str]],
    prompts_file: str | Path | None, prompts_per_domain: int,
    heldout_fraction: float, max_new_tokens: int, seed: int, min_rows: int, min_class: int,
    report_dir: str | Path | None, save_rollouts: bool, quiet: bool,
) -> Path:  # fmt: skip
    width, g = int(ro.mu.shape[1]), getattr(model, "block_size", None)
    if g is not None and width != g:
        raise UsageError(f"the rollouts hold {width} confidences per round, drafter {drafter} drafts blocks of {g}: "
                         "they were recorded with another drafter; record them with this one")  # fmt: skip
    held_ids = heldout_prompts([len(texts) for texts in pool.values()], heldout_fraction)
    held = torch.isin(ro.prompt, torch.tensor(held_ids, dtype=torch.long))
    if bool(held.all()):
        raise UsageError("every prompt is held out: lower --heldout_fraction or raise --prompts_per_domain")
    fit_rows = ro.confidence_rows(~held)
    res = heldout = None
    if fit_rows.z is not None:
        res = fit_sts(*ro.rows(~held), min_rows=min_rows, min_class=min_class)
        ones = torch.ones(len(res.temperatures), dtype=torch.float64)
        if bool(held.any()):
            heldout = tuple(position_reports(*ro.rows(held), t) for t in (ones, torch.tensor(res.temperatures)))
    chosen, picked = choose(fit_rows, ro.prompt[~held])
    scored = ro.confidence_rows(held if bool(held.any()) else ~held)
    conf_report = report(scored, chosen, picked, fit=fit_rows)
    replay = frontier(scored, chosen)
    dataset = {
        "domains": list(pool),
        "prompts": "STS pool" if prompts_file is None else str(prompts_file),
        "prompts_per_domain": {dom: len(texts) for dom, texts in pool.items()},
        "heldout_fraction": heldout_fraction,
        "rounds": int(ro.z.shape[0]),
        "fit_rounds": int((~held).sum()),
        "heldout_rounds": int(held.sum()),
        "max_new_tokens": max_new_tokens,
        "seed": seed,
    }
    sha = read_config(drafter)["weights_sha256"]
    path = save_calibration(drafter, res, temperature=temperature, dataset=dataset, weights_sha256=sha,
                            heldout=heldout, confidence=chosen, methods=picked,
                            confidence_report=conf_report, frontier=replay,
                            acceptance=None if acceptance == REJECTION else acceptance)  # fmt: skip
    doc = json.loads(path.read_text())
    which = "held-out" if bool(held.any()) else "fit set"
    under = "" if acceptance == REJECTION else f" ({acceptance} acceptance)"
    table = report_markdown(conf_report, f"Confidence at T = {temperature:g}{under}, {which} rounds ({len(scored.m)})")
    if not quiet:
        if res is not None:
            print(calibration_markdown(doc))
        print(table)
    if report_dir:
        out = Path(report_dir)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(out / "calibration_report.json", json.dumps(doc, indent=1) + "\n")
        md = (calibration_markdown(doc) + "\n\n" if res is not None else "") + table
        atomic_write(out / "calibration_report.md", md + "\n")
        if save_rollouts:
            ro.save(out / "rollouts.pt")
        if res is not None:
            rows = held if heldout is not None else ~held
            plot_reliability(*ro.rows(rows), torch.ones(len(res.temperatures)).tolist(), res.temperatures, out,
                             title=f"{which}, T = {temperature:g}")  # fmt: skip
    if not quiet:
        print(f"[dspark-lightning] calibration -> {path}", file=sys.stderr)
    return path
