"""``dspark-lightning eval``, ``bench``, ``calibrate``, ``threshold-sweep`` and ``serve-bench`` (no Lightning import).

dspark-lightning eval --drafter [dspark=outputs/compare/dspark/tb/version_0/drafter,dflash=...] --out DIR
dspark-lightning bench --drafter dspark=... --out outputs/bench
dspark-lightning bench --drafter DIR --scheduler [static,hardware_aware] --batching [padded,flat] --out DIR
dspark-lightning eval --drafter DIR --scheduler '{class_path: static, init_args: {gamma: 7}}' --temperature 0 --out DIR
dspark-lightning calibrate --drafter outputs/compare/dspark/tb/version_0/drafter --temperature 1.0
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .. import checks, devices
from ..checkpoint import load_target_and_drafters
from ..checks import UsageError
from ..data.prompts.sources import DOMAINS
from ..eval.runner import scheduler_label
from ..eval.serve_bench import DEFAULT_METHODS, method_text
from ..infer.acceptance.sampling import SamplingParams
from .decode import Batching, check_choice, check_sps_file, component_arg, scheduler_arg, several

Domain = Literal[DOMAINS]  # the built-in held-out sets
METHODS = tuple(method_text(m) for m in DEFAULT_METHODS)  # serve-bench's default


@dataclass(frozen=True, kw_only=True)
class Common:
    """The options every evaluation command takes (flags of its own in each: ``**common``), checked when given
    (before any model is loaded).

    Args:
        out: output directory
        drafter: exported drafter directory, optionally named: name=path; several: [a=DIR,b=DIR]
        target: default: the first drafter's target
        domains: built-in held-out sets: one, or a list [math,code]
        prompts_per_domain: prompts of each set
        max_new_tokens: most tokens generated per prompt
        seed: random seed of the sampling
        device: auto (CUDA when available) | cpu | cuda | cuda:N
        dtype: target: auto (bf16 on CUDA, fp32 on CPU) | bf16 | fp32
        drafter_dtype: drafter: auto (the faster of fp32/bf16 here) | bf16 | fp32
    """

    out: str
    drafter: str | list[str] = ()
    target: str | None = None
    domains: Domain | list[Domain] = DOMAINS
    prompts_per_domain: int = 8
    max_new_tokens: int = 64
    seed: int = 0
    device: str = "auto"
    dtype: str = "auto"
    drafter_dtype: str = "auto"

    def __post_init__(self) -> None:
        object.__setattr__(self, "drafter", several(self.drafter))
        object.__setattr__(self, "domains", several(self.domains))
        checks.at_least("--prompts_per_domain", self.prompts_per_domain, 1)
        checks.at_least("--max_new_tokens", self.max_new_tokens, 1)
        for spec in self.drafter:
            checks.drafter_config(spec.rpartition("=")[2])
        checks.output_dir("--out", self.out)
        devices.check_device_args(self.device, self.dtype, self.drafter_dtype)

    def load(self):
        """(target, {name: drafter}): a drafter is named by ``name=`` or after its registered kind; the target is
        ``--target`` or the first drafter's."""
        pairs = []
        for spec in self.drafter:
            name, _, path = spec.rpartition("=") if "=" in spec else ("", "", spec)
            cfg = checks.drafter_config(path)
            kind = (cfg.get("drafter") or {}).get("class_path") or ("dspark" if cfg.get("seq_head") else "dflash")
            pairs.append((name or kind, path, cfg))
        names = [n for n, _, _ in pairs]
        if len(set(names)) != len(names):
            raise UsageError(f"drafter names must be unique, got {names}; name them: --drafter name=path")
        target, models = load_target_and_drafters(self.target, [p for _, p, _ in pairs], dtype=self.dtype,
                                                  device=self.device, drafter_dtype=self.drafter_dtype)  # fmt: skip
        # refused here, not after the first domain's decode
        checks.fits_positions(target, self.max_new_tokens + 1, "--max_new_tokens with a one-token prompt")
        return target, dict(zip(names, models, strict=True))


@dataclass(frozen=True, kw_only=True)
class EvalCommon(Common):
    """``eval``'s: long answers, the paper's seed."""

    max_new_tokens: int = 256
    seed: int = 980406


@dataclass(frozen=True, kw_only=True)
class BenchCommon(Common):
    """``bench``'s: few prompts, every cell timed."""

    prompts_per_domain: int = 3


def scheduler_specs(schedulers: Sequence[str | dict], sps: str | None, flag: str = "--scheduler") -> list[dict]:
    """The schedulers a command runs, each checked, none twice."""
    specs = [scheduler_arg(text, sps, flag) for text in schedulers]
    labels = [scheduler_label(spec) for spec in specs]
    if len(set(labels)) != len(labels):
        raise checks.UsageError(f"{flag} names a scheduler twice: {' '.join(labels)}")
    return specs


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


def show(paths: dict[str, Path], table: str, command: str) -> None:
    """Print the markdown ``table`` a command wrote, then (on stderr) every file it wrote."""
    print(paths[table].read_text())
    print(f"[dspark-lightning] {command} -> {', '.join(str(p) for p in paths.values())}", file=sys.stderr)


def evaluate(
    *,
    scheduler: str | dict = "static",
    sps: str | None = None,
    dataset: str | list[str] = (),
    prompts: str | None = None,
    temperature: float = 1.0,
    batch_size: int = 8,
    **common,
) -> None:
    """τ table, position-wise acceptance and speed.

    Args:
        common: the options every evaluation command takes (:class:`EvalCommon`)
        scheduler: scheduler for every drafter: a name or {class_path: NAME, init_args: {...}} (default static:
            full blocks, as the paper's Table 1; {class_path: static, init_args: {gamma: 4}} verifies 4 drafts a round)
        sps: SPS table JSON for the schedulers that take one
        dataset: extra {"turns": [...]} JSONL: name=path.jsonl[:domain], or a list of them
        prompts: a responses JSONL (e.g. a recipe's <work_dir>/responses_heldout.jsonl) instead of the built-in
            sets: one set per source (python_stdlib/complete apart), its first --prompts_per_domain first user turns
        temperature: sampling temperature (paper: 1.0; 0 = greedy)
        batch_size: concurrent requests
    """
    from ..eval.runner import builtin_datasets, jsonl_dataset, responses_datasets, write_eval
    from ..eval.runner import evaluate as run_evaluation

    opts = EvalCommon(**common)
    dataset = several(dataset)
    if not opts.drafter:
        raise UsageError("give at least one --drafter [name=]path")
    (spec,) = scheduler_specs([scheduler], sps)
    SamplingParams(temperature)  # the sampling law checks its own arguments, before any model loads
    checks.at_least("--batch_size", batch_size, 1)
    for text in dataset:
        check_dataset_spec(text)
    if prompts is not None:
        checks.input_file("--prompts", prompts)
        try:
            datasets = responses_datasets(prompts, opts.prompts_per_domain)
        except (OSError, ValueError) as exc:
            raise checks.UsageError(f"--prompts {prompts}: {exc}") from None
    else:
        datasets = builtin_datasets(opts.domains, opts.prompts_per_domain)
    datasets += [jsonl_dataset(s, opts.prompts_per_domain) for s in dataset]  # read before any model loads
    names = [d.name for d in datasets]
    if len(set(names)) != len(names):
        raise checks.UsageError(f"two prompt sets share a name ({', '.join(names)}): rename the --dataset")
    tgt, drafters = opts.load()
    doc = run_evaluation(
        tgt,
        drafters,
        datasets,
        temperature=temperature,
        max_new_tokens=opts.max_new_tokens,
        batch_size=batch_size,
        scheduler=spec,
        seed=opts.seed,
    )
    show(write_eval(doc, opts.out), "tau_table.md", "eval")


def bench(
    *,
    scheduler: str | dict | list[str | dict] = "auto",
    sps: str | None = None,
    temperatures: float | list[float] = (0.0, 1.0),
    batches: int | list[int] = (1, 8),
    repeats: int = 2,
    prompt_lookup_tokens: int = 10,
    acceptance: str | list[str] = "rejection",
    batching: Batching | list[Batching] = "padded",
    **common,
) -> None:
    """Side-by-side throughput on the same target.

    Args:
        common: the options every evaluation command takes (:class:`BenchCommon`)
        scheduler: scheduler(s) for every drafter, each a name or {class_path: NAME, init_args: {...}}; several: one
            row per drafter and scheduler
        sps: SPS table JSON for the schedulers that take one
        temperatures: sampling temperatures (a cell each)
        batches: concurrent requests (a cell each)
        repeats: alternating repeats per cell (order reversed each time)
        prompt_lookup_tokens: HF prompt-lookup candidate length
        acceptance: rejection and/or coupled (T > 0: extra rows under coupled acceptance)
        batching: how our decoders batch requests: padded and/or flat (both: a row per decoder and mode)
    """
    from ..eval.bench import bench as run_bench
    from ..eval.bench import write_bench
    from ..eval.runner import builtin_datasets

    opts = BenchCommon(**common)
    scheduler, temperatures, batches = several(scheduler), several(temperatures), several(batches)
    acceptance, batching = several(acceptance), several(batching)
    specs = scheduler_specs(scheduler, sps)
    for t in temperatures:
        SamplingParams(t)
    for b in batches:
        checks.at_least("--batches", b, 1)
    checks.at_least("--repeats", repeats, 1)
    checks.at_least("--prompt_lookup_tokens", prompt_lookup_tokens, 1)
    for x in acceptance:
        component_arg("--acceptance", "acceptance", x)
    if len(set(batching)) != len(batching):
        raise checks.UsageError(f"--batching names a mode twice: {' '.join(batching)}")
    tgt, drafters = opts.load()
    sets = {d.domain: d.prompts for d in builtin_datasets(opts.domains, opts.prompts_per_domain)}
    doc = run_bench(
        tgt,
        drafters,
        sets,
        temperatures=tuple(temperatures),
        batches=tuple(batches),
        max_new_tokens=opts.max_new_tokens,
        repeats=repeats,
        schedulers={scheduler_label(spec): spec for spec in specs},
        seed=opts.seed,
        prompt_lookup_tokens=prompt_lookup_tokens,
        acceptance=tuple(acceptance),
        batching=tuple(batching),
    )
    show(write_bench(doc, opts.out), "bench.md", "bench")


def calibrate(drafter: str, **kwargs) -> None:
    """Fit STS confidence temperatures of a drafter for one serving temperature (the flags are the arguments of
    :func:`dspark_lightning.calibration.calibrate`, so the command and the Python API take the same ones).

    Args:
        drafter: exported drafter directory (the file is saved there)
    """
    from dspark_lightning.calibration import calibrate as fit_sts  # absolute: jsonargparse reads its parameters

    fit_sts(drafter, target=None, quiet=False, **kwargs)


def threshold_sweep(
    *,
    thresholds: float | list[float] = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
    mode: Literal["cumulative", "raw"] = "cumulative",
    temperature: float = 1.0,
    batch_size: int = 8,
    raw_confidences: bool = False,
    **common,
) -> None:
    """Confidence-threshold sweep (Figure 5) of one drafter.

    Args:
        common: the options every evaluation command takes (:class:`Common`; exactly one --drafter)
        thresholds: the confidence thresholds swept
        mode: cumulative (calibrated survival a_k) or raw
        temperature: sampling temperature
        batch_size: concurrent requests
        raw_confidences: ignore the drafter's STS calibration
    """
    from ..eval.runner import builtin_datasets
    from ..eval.sweep import threshold_sweep as run_sweep
    from ..eval.sweep import write_threshold_sweep

    opts, thresholds = Common(**common), several(thresholds)
    if len(opts.drafter) != 1:
        raise UsageError("give exactly one --drafter")
    for t in thresholds:
        checks.probability("--thresholds", t)
    SamplingParams(temperature)  # the sampling law checks its own arguments, before any model loads
    checks.at_least("--batch_size", batch_size, 1)
    tgt, drafters = opts.load()
    doc = run_sweep(
        tgt,
        next(iter(drafters.values())),
        builtin_datasets(opts.domains, opts.prompts_per_domain),
        thresholds=list(thresholds),
        mode=mode,
        temperature=temperature,
        max_new_tokens=opts.max_new_tokens,
        batch_size=batch_size,
        calibrated=not raw_confidences,
        seed=opts.seed,
    )
    show(write_threshold_sweep(doc, opts.out), "threshold_sweep.md", "threshold-sweep")


def serve_bench(
    *,
    sps: str | None = None,
    concurrency: int | list[int] = (1, 2, 4, 8, 16, 32),
    methods: str | dict | list[str | dict] = METHODS,
    window_s: float = 20.0,
    repeats: int = 1,
    batching: Batching = "padded",
    temperature: float = 1.0,
    **common,
) -> None:
    """Closed-loop concurrency study (Figures 7-8) of one drafter's schedulers (none: plain decoding only); the
    domains' prompts interleaved.

    Args:
        common: the options every evaluation command takes (:class:`Common`; at most one --drafter)
        sps: SPS table JSON for hardware_aware schedulers
        concurrency: concurrent clients (a cell each)
        methods: plain, or a scheduler as --scheduler takes it: a name or {class_path: NAME, init_args: {...}}
        window_s: measured seconds per cell (after warm-up)
        repeats: runs per cell (order reversed each time); rows are means
        batching: padded or flat: how requests share a forward (docs/inference.md)
        temperature: sampling temperature
    """
    from ..eval.runner import builtin_datasets
    from ..eval.serve_bench import serve_bench as run_serve_bench
    from ..eval.serve_bench import write_serve_bench

    opts, concurrency, methods = Common(**common), several(concurrency), several(methods)
    if len(opts.drafter) > 1:
        raise UsageError("give one --drafter (the methods compare its schedulers)")
    if sps:
        check_sps_file(sps)
    for c in concurrency:
        checks.at_least("--concurrency", c, 1)
    for m in methods:  # plain, or a scheduler as --scheduler takes it
        if m != "plain":
            scheduler_arg(m, sps, "--methods")
    checks.in_range("--window_s", window_s, 0.0, open_low=True)
    checks.at_least("--repeats", repeats, 1)
    SamplingParams(temperature)  # the sampling law checks its own arguments, before any model loads
    tgt, drafters = opts.load()
    table = None
    if sps:
        from ..infer import SPSTable

        table = SPSTable.load(sps)
    datasets = builtin_datasets(opts.domains, opts.prompts_per_domain)
    prompts = [p for group in zip(*(d.prompts for d in datasets), strict=True) for p in group]  # domains interleaved
    doc = run_serve_bench(
        tgt,
        next(iter(drafters.values()), None),
        prompts,
        concurrency=tuple(concurrency),
        methods=list(methods),
        sps=table,
        temperature=temperature,
        max_new_tokens=opts.max_new_tokens,
        window_s=window_s,
        repeats=repeats,
        seed=opts.seed,
        batching=batching,
    )
    show(write_serve_bench(doc, opts.out), "serve_bench.md", "serve-bench")
