"""``dspark-lightning eval`` and ``dspark-lightning bench`` (no Lightning import).

dspark-lightning eval --drafter dspark=outputs/compare/dspark/tb/version_0/drafter --drafter dflash=... --out DIR
dspark-lightning bench --drafter dspark=... --out outputs/bench
dspark-lightning bench --drafter DIR --scheduler static hardware_aware --layouts padded flat --out DIR
dspark-lightning eval --drafter DIR --scheduler static --gamma 7 --temperature 0 --batch_size 1 --out DIR
dspark-lightning calibrate --drafter outputs/compare/dspark/tb/version_0/drafter --temperature 1.0
"""

from __future__ import annotations

import sys
from pathlib import Path

from jsonargparse import ArgumentParser

from .. import checks
from ..checkpoint import load_drafter_checked
from ..targets import load_target_checked
from .decode import (
    LAYOUTS,
    add_device_args,
    check_choice,
    check_device_args,
    check_scheduler_args,
    check_sps_file,
)

DOMAINS = ("math", "code", "chat")  # the built-in held-out sets; a --dataset names one of them as its domain


def _common(
    p: ArgumentParser, max_new: int, seed: int, scheduler_help: str | None, sps: bool = True, many: bool = False
) -> None:
    """The options every command shares; ``scheduler_help=None`` for commands that choose schedulers themselves,
    ``many``: ``--scheduler`` takes one or more names."""
    p.add_argument(
        "--drafter",
        type=str,
        action="append",
        default=[],
        help="exported drafter directory, optionally named: name=path (repeatable)",
    )
    p.add_argument("--target", type=str | None, default=None, help="default: the first drafter's target")
    p.add_argument("--domains", type=str, nargs="+", default=["math", "code", "chat"], help="built-in held-out sets")
    p.add_argument("--prompts_per_domain", type=int, default=8)
    p.add_argument("--max_new_tokens", type=int, default=max_new)
    p.add_argument("--seed", type=int, default=seed)
    if scheduler_help is not None and many:
        p.add_argument("--scheduler", type=str, nargs="+", default=["static"], help=scheduler_help)
    elif scheduler_help is not None:
        p.add_argument("--scheduler", type=str, default="static", help=scheduler_help)
    if scheduler_help is not None:
        p.add_argument(
            "--gamma", type=int | None, default=None, help="static: drafts verified per round (default: whole blocks)"
        )
    if sps:
        p.add_argument("--sps", type=str | None, default=None, help="SPS table JSON for hardware_aware schedulers")
    p.add_argument("--out", type=str, required=True, help="output directory")
    add_device_args(p)


def check_common(a) -> None:
    """The shared options, checked before any model is loaded: sizes, domains, the files read and the output."""
    checks.at_least("--prompts_per_domain", a.prompts_per_domain, 1)
    checks.at_least("--max_new_tokens", a.max_new_tokens, 1)
    for d in a.domains:
        check_choice("--domains", d, DOMAINS)
    for spec in a.drafter:
        checks.drafter_config(spec.rpartition("=")[2])
    schedulers = getattr(a, "scheduler", None)
    if schedulers is not None:
        names = schedulers if isinstance(schedulers, list) else [schedulers]
        for name in names:
            check_scheduler_args(name, a.gamma, sps=getattr(a, "sps", None))
        if len(set(names)) != len(names):
            raise checks.UsageError(f"--scheduler names a scheduler twice: {' '.join(names)}")
        if a.gamma is not None and "static" not in names:
            raise checks.UsageError("--gamma fixes the static scheduler's block: give it with --scheduler static")
    elif getattr(a, "sps", None):
        check_sps_file(a.sps)
    checks.output_dir("--out", a.out)
    check_device_args(a)


def check_dataset_spec(spec: str) -> None:
    """``name=path.jsonl[:domain]``: the file exists and the domain, when given, is a built-in one (the macro
    average is over domains, so an unknown one would enter it as a fourth)."""
    name, eq, rest = spec.partition("=")
    if not eq or not name:
        raise checks.UsageError(f"--dataset wants name=path.jsonl[:domain], got {spec!r}")
    path, _, domain = rest.partition(":") if not Path(rest).is_file() else (rest, "", "")
    checks.input_file(f"--dataset {name}:", path)
    if domain:
        check_choice(f"--dataset {name}: domain", domain, DOMAINS)


def eval_parser() -> ArgumentParser:
    p = ArgumentParser(prog="dspark-lightning eval", description="τ table, position-wise acceptance and speed.",
                       exit_on_error=False)  # fmt: skip
    _common(p, 256, 980406, "scheduler for every drafter (default static: full blocks, as the paper's Table 1)")
    p.add_argument(
        "--dataset",
        type=str,
        action="append",
        default=[],
        help='extra {"turns": [...]} JSONL: name=path.jsonl[:domain] (repeatable)',
    )
    p.add_argument(
        "--prompts",
        type=str | None,
        default=None,
        help="a responses JSONL (e.g. a recipe's <work_dir>/responses_heldout.jsonl) instead of the built-in sets: "
        "one set per source (python_stdlib/complete apart), its first --prompts_per_domain first user turns",
    )
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (paper: 1.0; 0 = greedy)")
    p.add_argument("--batch_size", type=int, default=8, help="concurrent requests")
    return p


def bench_parser() -> ArgumentParser:
    p = ArgumentParser(prog="dspark-lightning bench", description="Side-by-side throughput on the same target.",
                       exit_on_error=False)  # fmt: skip
    _common(p, 64, 0, "scheduler(s) for every drafter; several: one row per drafter and scheduler", many=True)
    p.set_defaults(scheduler=["auto"], prompts_per_domain=3)
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--repeats", type=int, default=2, help="alternating repeats per cell (order reversed each time)")
    p.add_argument("--prompt_lookup_tokens", type=int, default=10, help="HF prompt-lookup candidate length")
    p.add_argument("--acceptance", type=str, nargs="+", default=["rejection"],
                   help="rejection and/or coupled (T > 0: extra rows under coupled acceptance)")  # fmt: skip
    p.add_argument("--layouts", type=str, nargs="+", default=["padded"],
                   help="KV-cache layouts of our decoders: padded and/or flat (several: a row per decoder and "
                   "layout)")  # fmt: skip
    return p


def load_drafters(specs: list[str], target_name: str | None, a=None):
    """``name=path`` or ``path`` (named after the registered drafter) -> (target, {name: drafter}).

    ``a``: parsed arguments with ``device`` / ``dtype`` / ``drafter_dtype`` (default: auto, the fastest drafter dtype).
    """
    pairs = []
    for spec in specs:
        name, _, path = spec.rpartition("=") if "=" in spec else ("", "", spec)
        cfg = checks.drafter_config(path)
        pairs.append((name or cfg.get("drafter") or ("dspark" if cfg.get("seq_head") else "dflash"), path, cfg))
    names = [n for n, _, _ in pairs]
    if len(set(names)) != len(names):
        raise ValueError(f"drafter names must be unique, got {names}; name them: --drafter name=path")
    if target_name is None:
        if not pairs:
            raise ValueError("give --target or at least one --drafter")
        target_name = pairs[0][2]["target"]["name"]
    device, dtype, ddtype = (a.device, a.dtype, a.drafter_dtype) if a is not None else ("auto", "auto", "auto")
    from ..checkpoint import recorded_target_args

    recorded = recorded_target_args(pairs[0][1]) if pairs else {}  # the first drafter's layers and chat format
    target = load_target_checked(target_name, dtype=dtype, device=device, **recorded)
    if isinstance(getattr(a, "max_new_tokens", None), int):  # refused here, not after the first domain's decode
        checks.fits_positions(target, a.max_new_tokens + 1, "--max_new_tokens with a one-token prompt")
    return target, {n: load_drafter_checked(p, target, ddtype) for n, p, _ in pairs}


def _scheduler(a, name: str | None = None):
    """The spec of ``--scheduler`` (or of ``name``, one of several): ``static`` with ``--gamma`` as its fixed block,
    a hardware-aware one with the ``--sps`` table."""
    name = a.scheduler if name is None else name
    if name == "static" and getattr(a, "gamma", None) is not None:
        return {"name": "static", "gamma": a.gamma}
    if a.sps and (name == "auto" or "hardware_aware" in name):
        from ..infer import SPSTable

        return {"name": name, "sps": SPSTable.load(a.sps)}
    return name


def run_eval(argv: list[str]) -> None:
    from ..eval.runner import builtin_datasets, evaluate, jsonl_dataset, responses_datasets, write_eval

    a = eval_parser().parse_args(argv)
    if not a.drafter:
        raise ValueError("give at least one --drafter [name=]path")
    check_common(a)
    checks.temperature("--temperature", a.temperature)
    checks.at_least("--batch_size", a.batch_size, 1)
    for spec in a.dataset:
        check_dataset_spec(spec)
    if a.prompts is not None:
        checks.input_file("--prompts", a.prompts)
        try:
            datasets = responses_datasets(a.prompts, a.prompts_per_domain)
        except (OSError, ValueError) as exc:
            raise checks.UsageError(f"--prompts {a.prompts}: {exc}") from None
    else:
        datasets = builtin_datasets(a.domains, a.prompts_per_domain)
    datasets += [jsonl_dataset(s, a.prompts_per_domain) for s in a.dataset]  # read before any model loads
    names = [d.name for d in datasets]
    if len(set(names)) != len(names):
        raise checks.UsageError(f"two prompt sets share a name ({', '.join(names)}): rename the --dataset")
    target, drafters = load_drafters(a.drafter, a.target, a)
    doc = evaluate(
        target,
        drafters,
        datasets,
        temperature=a.temperature,
        max_new_tokens=a.max_new_tokens,
        batch_size=a.batch_size,
        scheduler=_scheduler(a),
        seed=a.seed,
    )
    paths = write_eval(doc, a.out)
    print(paths["tau_table.md"].read_text())
    print(f"[dspark-lightning] eval -> {', '.join(str(p) for p in paths.values())}", file=sys.stderr)


def run_bench(argv: list[str]) -> None:
    from ..eval.bench import bench, write_bench
    from ..eval.runner import builtin_datasets, scheduler_label

    a = bench_parser().parse_args(argv)
    check_common(a)
    for t in a.temperatures:
        checks.temperature("--temperatures", t)
    for b in a.batches:
        checks.at_least("--batches", b, 1)
    checks.at_least("--repeats", a.repeats, 1)
    checks.at_least("--prompt_lookup_tokens", a.prompt_lookup_tokens, 1)
    for x in a.acceptance:
        check_choice("--acceptance", x, ["rejection", "coupled"])
    for layout in a.layouts:
        check_choice("--layouts", layout, LAYOUTS)
    if len(set(a.layouts)) != len(a.layouts):
        raise checks.UsageError(f"--layouts names a layout twice: {' '.join(a.layouts)}")
    specs = [_scheduler(a, name) for name in a.scheduler]
    target, drafters = load_drafters(a.drafter, a.target, a)
    sets = {d.domain: d.prompts for d in builtin_datasets(a.domains, a.prompts_per_domain)}
    doc = bench(
        target,
        drafters,
        sets,
        temperatures=tuple(a.temperatures),
        batches=tuple(a.batches),
        max_new_tokens=a.max_new_tokens,
        repeats=a.repeats,
        schedulers={scheduler_label(s): s for s in specs},
        seed=a.seed,
        prompt_lookup_tokens=a.prompt_lookup_tokens,
        acceptance=tuple(a.acceptance),
        layouts=tuple(a.layouts),
    )
    paths = write_bench(doc, a.out)
    print(paths["bench.md"].read_text())
    print(f"[dspark-lightning] bench -> {', '.join(str(p) for p in paths.values())}", file=sys.stderr)


def calibrate_parser() -> ArgumentParser:
    from ..calibration import DOMAINS as CAL_DOMAINS
    from ..calibration import MIN_CLASS, MIN_ROWS

    p = ArgumentParser(prog="dspark-lightning calibrate", description="Fit STS confidence temperatures.",
                       exit_on_error=False)  # fmt: skip
    p.add_argument("--drafter", type=str, required=True, help="exported drafter directory (the file is saved there)")
    p.add_argument("--temperature", type=float, default=1.0, help="serving temperature the calibration is for")
    p.add_argument("--domains", type=str, nargs="+", default=list(CAL_DOMAINS))
    p.add_argument("--prompts_per_domain", type=int, default=16, help="STS pool prompts per domain")
    p.add_argument("--heldout_fraction", type=float, default=0.5, help="prompts kept out of the fit and scored after")
    p.add_argument("--max_new_tokens", type=int, default=128)
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min_rows", type=int, default=MIN_ROWS, help="fewer rounds at a position: copy the previous T")
    p.add_argument(
        "--min_class", type=int, default=MIN_CLASS, help="fewer surviving or failing rounds: copy the previous T"
    )
    p.add_argument("--report_dir", type=str | None, default=None, help="also write report JSON, PNGs and rollouts.pt")
    p.add_argument("--rollouts", type=str | None, default=None, help="refit from a saved rollouts.pt (no decoding)")
    add_device_args(p)
    return p


def run_calibrate(argv: list[str]) -> None:
    """``dspark-lightning calibrate``: :func:`dspark_lightning.calibration.calibrate` with the parsed flags."""
    from ..calibration import calibrate

    a = calibrate_parser().parse_args(argv).as_dict()
    a["rollouts_file"] = a.pop("rollouts")
    calibrate(**a)


def sweep_parser() -> ArgumentParser:
    p = ArgumentParser(prog="dspark-lightning threshold-sweep", description="Confidence-threshold sweep (Figure 5).",
                       exit_on_error=False)  # fmt: skip
    _common(p, 64, 0, None, sps=False)
    p.add_argument("--thresholds", type=float, nargs="+", default=[round(0.1 * i, 1) for i in range(10)])
    p.add_argument("--mode", type=str, default="cumulative", help="cumulative (calibrated survival a_k) or raw")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--raw_confidences", type=bool, default=False, help="ignore the drafter's STS calibration")
    return p


def run_threshold_sweep(argv: list[str]) -> None:
    from ..eval.runner import builtin_datasets
    from ..eval.sweep import threshold_sweep, write_threshold_sweep

    a = sweep_parser().parse_args(argv)
    if len(a.drafter) != 1:
        raise ValueError("give exactly one --drafter")
    check_common(a)
    for t in a.thresholds:
        checks.probability("--thresholds", t)
    check_choice("--mode", a.mode, ("cumulative", "raw"))
    checks.temperature("--temperature", a.temperature)
    checks.at_least("--batch_size", a.batch_size, 1)
    target, drafters = load_drafters(a.drafter, a.target, a)
    doc = threshold_sweep(
        target,
        next(iter(drafters.values())),
        builtin_datasets(a.domains, a.prompts_per_domain),
        thresholds=a.thresholds,
        mode=a.mode,
        temperature=a.temperature,
        max_new_tokens=a.max_new_tokens,
        batch_size=a.batch_size,
        calibrated=not a.raw_confidences,
        seed=a.seed,
    )
    paths = write_threshold_sweep(doc, a.out)
    print(paths["threshold_sweep.md"].read_text())
    print(f"[dspark-lightning] threshold-sweep -> {', '.join(str(p) for p in paths.values())}", file=sys.stderr)


def serve_parser() -> ArgumentParser:
    from ..eval.serve import DEFAULT_METHODS

    p = ArgumentParser(prog="dspark-lightning serve-bench", description="Closed-loop concurrency study (Figures 7-8).",
                       exit_on_error=False)  # fmt: skip
    _common(p, 64, 0, None)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    p.add_argument("--methods", type=str, nargs="+", default=DEFAULT_METHODS,
                   help="plain, static:γ, threshold:θ, hardware_aware, async_hardware_aware")  # fmt: skip
    p.add_argument("--window_s", type=float, default=20.0, help="measured seconds per cell (after warm-up)")
    p.add_argument("--repeats", type=int, default=1, help="runs per cell (order reversed each time); rows are means")
    p.add_argument("--layout", type=str, default="padded", help="cache layout: padded or flat (docs/inference.md)")
    p.add_argument("--temperature", type=float, default=1.0)
    return p


def run_serve_bench(argv: list[str]) -> None:
    from ..eval.runner import builtin_datasets
    from ..eval.serve import serve_bench, write_serve_bench

    a = serve_parser().parse_args(argv)
    if len(a.drafter) > 1:
        raise ValueError("give one --drafter (the methods compare its schedulers)")
    check_serve_args(a)
    target, drafters = load_drafters(a.drafter, a.target, a)
    sps = None
    if a.sps:
        from ..infer import SPSTable

        sps = SPSTable.load(a.sps)
    datasets = builtin_datasets(a.domains, a.prompts_per_domain)
    prompts = [p for group in zip(*(d.prompts for d in datasets), strict=True) for p in group]  # domains interleaved
    doc = serve_bench(
        target,
        next(iter(drafters.values()), None),
        prompts,
        concurrency=tuple(a.concurrency),
        methods=a.methods,
        sps=sps,
        temperature=a.temperature,
        max_new_tokens=a.max_new_tokens,
        window_s=a.window_s,
        repeats=a.repeats,
        seed=a.seed,
        layout=a.layout,
    )
    paths = write_serve_bench(doc, a.out)
    print(paths["serve_bench.md"].read_text())
    print(f"[dspark-lightning] serve-bench -> {', '.join(str(p) for p in paths.values())}", file=sys.stderr)


def check_serve_args(a) -> None:
    """Concurrency levels, methods (``static:γ`` with γ >= 1, ``threshold:θ`` with θ in [0, 1]), window and repeats."""
    from ..eval.serve import method_scheduler

    check_common(a)
    for c in a.concurrency:
        checks.at_least("--concurrency", c, 1)
    for m in a.methods:
        name, _, arg = m.partition(":")
        try:
            method_scheduler(m)
        except ValueError as exc:  # int("x") / float("x") name the value, not the option
            raise checks.UsageError(f"--methods {m!r}: {exc}") from None
        if arg and name == "static":
            checks.at_least(f"--methods {m}: γ", int(arg), 1)
        if arg and name == "threshold":
            checks.probability(f"--methods {m}: θ", float(arg))
    checks.in_range("--window_s", a.window_s, 0.0, open_low=True)
    checks.at_least("--repeats", a.repeats, 1)
    check_choice("--layout", a.layout, ("padded", "flat"))
    checks.temperature("--temperature", a.temperature)
