"""``dspark-lightning data-curve``: how many samples and epochs a wanted τ needs, for the recipe's own target.

    dspark-lightning data-curve --recipe recipes/smollm2_dspark.yaml --samples [250,500,1000] --epochs 3 \\
        --want_tau 2.0 --out outputs/data_curve
    dspark-lightning data-curve --recipe [R.yaml,more.yaml] --samples [300,600,1200,2400] --epochs [3,10] \\
        --fit_upto 1200 --out DIR

The recipe's data is prepared once (``prepare``; reused when done); each arm is a ``fit`` of the recipe on the first
``samples`` prepared conversations (``train_samples`` of ``data.features: cached``) for ``epochs`` passes, counted in
optimizer steps (no wall budget, so a loaded machine changes the time, not the result), then decoded at T = 0 with a
static block, batch 1, on held-out prompts of each set (:mod:`dspark_lightning.eval.data_curve`). A finished arm is a
JSON file in ``--out``: rerun the same command to finish a half-done grid. ``--fit_upto N`` fits on the arms up to N
samples and reports its prediction for the larger ones against what they measured.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .. import checks
from ..atomic import atomic_write
from ..eval import data_curve as dc
from .decode import several


def _merged(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def subset(recipe: dict, samples: int) -> dict:
    """The recipe's cached feature mode, keeping its own settings, training on ``samples`` conversations."""
    mode = recipe.get("data", {}).get("features", "cached")
    if isinstance(mode, str):
        mode = {"class_path": mode}
    if mode.get("class_path") != "cached":
        raise checks.UsageError(f"data-curve trains on subsets of a prepared cache: the recipe's data.features must be "
                                f"cached, got {mode.get('class_path')!r}")  # fmt: skip
    return {"class_path": "cached", "init_args": {**(mode.get("init_args") or {}), "train_samples": samples}}


def arm_recipe(recipe: dict, arm: dc.Arm, run_dir: Path, minutes: float | None = None) -> tuple[dict, int]:
    """The recipe trained on the arm's samples for its epochs (optimizer steps; no validation, no server exports, no
    calibration), logging to a CSV in ``run_dir``; and its step count. No wall budget, unless ``minutes``: then
    training stops at that budget (the learning-rate schedule spans it) or after the epochs, whichever comes first."""
    batch = int(recipe.get("data", {}).get("batch_size", 4))
    steps = arm.steps(batch)
    r = _merged(
        recipe, {"data": {"features": subset(recipe, arm.samples)}, "export": {"servers": [], "calibrate": None}}
    )
    trainer = r.setdefault("trainer", {})
    seconds = None if minutes is None else round(60 * minutes)
    trainer.update(max_steps=steps, max_time=None if seconds is None else {"seconds": seconds},
                   default_root_dir=str(run_dir), limit_val_batches=0,
                   logger=[{"class_path": "lightning.pytorch.loggers.CSVLogger",
                            "init_args": {"save_dir": str(run_dir), "name": "csv"}}])  # fmt: skip
    trainer["callbacks"] = [c for c in trainer.get("callbacks") or [] if "ModelCheckpoint" not in str(c)]
    r.setdefault("model", {}).setdefault("optim", {})["time_budget_s"] = seconds
    return r, steps


def _run(cmd: list[str], log: Path, what: str) -> float:
    """Run a ``dspark-lightning`` subprocess into ``log``; its wall seconds. A failure is one line naming the log."""
    t0 = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if rc.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
        raise checks.UsageError(f"{what} failed (exit {rc.returncode}): {tail[0]} (full log: {log})")
    return time.perf_counter() - t0


def run_arm(recipe: dict, arm: dc.Arm, work: Path, prompts: dict[str, list[str]], gamma: int,
            max_new_tokens: int, minutes: float | None = None) -> dc.ArmResult:  # fmt: skip
    """Train (unless a finished drafter is there) and decode one arm; ``minutes``: a wall budget for its training
    (:func:`arm_recipe`), its steps then those it trained."""
    import yaml
    from tqdm.auto import tqdm

    from ..checkpoint import load_target_and_drafters
    from ..devices import cpu_model

    run_dir = work / arm.name
    run_dir.mkdir(parents=True, exist_ok=True)
    r, steps = arm_recipe(recipe, arm, run_dir, minutes)
    drafter, done = run_dir / "drafter", run_dir / "fit_done.json"
    if not done.is_file():
        path = run_dir / "recipe.yaml"
        path.write_text(yaml.safe_dump(r, sort_keys=False))
        print(f"[data-curve] {arm.name}: training {steps:,} steps (log: {run_dir / 'fit.log'})", flush=True)
        cmd = [sys.executable, "-m", "dspark_lightning.cli", "fit", "--config", str(path),
               "--validate_before_fit", "false", "--export.dir", str(drafter)]  # fmt: skip
        wall = _run(cmd, run_dir / "fit.log", f"fit of arm {arm.name}")
        stats = sorted(run_dir.glob("csv/version_*/fit_stats.json"), key=lambda p: p.stat().st_mtime)
        trained = json.loads(stats[-1].read_text())["steps"] if stats else steps
        atomic_write(done, json.dumps({"fit_wall_s": round(wall, 1), "cpu": cpu_model(), "steps": trained}) + "\n")
    fit = json.loads(done.read_text())
    steps = fit.get("steps", steps)
    target, (model,) = load_target_and_drafters(None, [drafter])
    bar = tqdm(total=sum(map(len, prompts.values())), desc=f"decode {arm.name}", unit="prompt")
    t0 = time.perf_counter()
    counts = {s: dc.decode_counts(target, model, ps, gamma=gamma, max_new_tokens=max_new_tokens, progress=bar)
              for s, ps in prompts.items()}  # fmt: skip
    bar.close()
    info = {**fit, "decode_wall_s": round(time.perf_counter() - t0, 1), "gamma": gamma,
            "max_new_tokens": max_new_tokens, "date": time.strftime("%Y-%m-%d"), "commit": _commit()}  # fmt: skip
    return dc.ArmResult(arm, steps, counts, info)


def _commit() -> str | None:
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
    return r.stdout.strip() or None


def check_samples(data_dir: Path, most: int) -> None:
    """Refuse a grid whose largest arm asks for more conversations than the preparation holds, before any training."""
    from ..data.features.cache import FeatureCache
    from ..data.prepare import DataPaths, first_prompts

    ids = FeatureCache(DataPaths(data_dir).cache("train")).sample_ids()
    try:
        first_prompts(ids, most, 0)
    except ValueError as exc:
        raise checks.UsageError(f"--samples {most}: {exc}") from None


def report(results: list[dc.ArmResult], out: Path, want_tau: float, batch_size: int, fit_upto: int | None,
           title: str) -> str:  # fmt: skip
    """Fit, tables and plot of the finished arms into ``out`` (curve.md, curve.json, curve.png); the Markdown."""
    curves = [c for m in ("tau", "A_1") for c in dc.fit_curves(results, m)]
    parts = [title, "", "Measured arms (95 % bootstrap interval over prompts):", "", dc.arms_table(results)]
    doc: dict[str, Any] = {"want_tau": want_tau, "fits": [
        {"metric": c.metric, "set": c.set, "epochs": c.epochs, "hi": c.fit.hi, "half": c.fit.half,
         "saturating": c.fit.saturating, "samples_for_want": c.samples_for(want_tau) if c.metric == "tau" else None}
        for c in curves]}  # fmt: skip
    if curves:
        parts += ["", f"Fitted τ(n) = 1 + (hi - 1) n / (n + h) per set and epoch count; samples for τ = {want_tau:g}:",
                  "", dc.needs_table(curves, want_tau, batch_size)]  # fmt: skip
        dc.plot_curves(curves, out / "curve.png", title=title, want=want_tau)
    if fit_upto is not None:
        held = [c for m in ("tau", "A_1") for c in dc.fit_curves([r for r in results if r.arm.samples <= fit_upto], m)]
        rows = dc.prediction_rows(held, results, fit_upto)
        doc["prediction"] = {"fit_upto": fit_upto, "rows": rows}
        if rows:
            parts += ["", f"Fitted on the arms up to {fit_upto:,} samples, predicted for the larger ones:", "",
                      "| metric | set | epochs | samples | predicted [95 %] | measured | error |",
                      "|---|---|---|---|---|---|---|"]  # fmt: skip
            parts += [f"| {r['metric']} | {r['set']} | {r['epochs']:g} | {r['samples']:,} | {r['predicted']:.3f} "
                      f"[{r['interval'][0]:.2f}, {r['interval'][1]:.2f}] | {r['measured']:.3f} | {r['error']:+.3f} |"
                      for r in rows]  # fmt: skip
    text = "\n".join(parts) + "\n"
    atomic_write(out / "curve.md", text)
    atomic_write(out / "curve.json", json.dumps(doc, indent=1) + "\n")
    return text


def data_curve(
    recipe: str | list[str],
    out: str,
    samples: int | list[int] = (250, 500, 1000),
    epochs: float | list[float] = (3.0,),
    prompts_per_set: int = 30,
    max_new_tokens: int = 96,
    gamma: int = 7,
    want_tau: float = 2.0,
    fit_upto: int | None = None,
    work_dir: str | None = None,
    report_only: bool = False,
) -> None:
    """How many training samples and epochs a wanted τ needs for a recipe's target: a few arms trained and decoded,
    a saturating curve fitted per set, inverted.

    Args:
        recipe: the recipe (its target, sources and training settings); a list: the later files are merged over the
            first in order (a dict merges key by key, anything else is replaced)
        out: where each finished arm (arms/<arm>.json), curve.md, curve.json and curve.png go; rerun to resume
        samples: training conversations per arm (nested subsets of one preparation)
        epochs: passes over an arm's conversations (each arm trains samples x epochs / batch size steps)
        prompts_per_set: held-out prompts decoded per set (math, code, chat), from the recipe's held-out split
        max_new_tokens: tokens decoded per prompt
        gamma: the static block every arm is decoded with (T = 0, batch 1)
        want_tau: the τ the samples-needed table answers for
        fit_upto: fit on the arms up to this many samples and report the prediction for the larger ones
        work_dir: where the arms train (default: <out>/runs; not part of the result)
        report_only: fit and report the finished arms only (train or decode nothing)
    """
    import yaml

    files, samples, epochs = several(recipe), several(samples), several(epochs)
    recipe = {}
    for c in files:
        recipe = _merged(recipe, yaml.safe_load(Path(checks.input_file("--recipe", c)).read_text()) or {})
    for flag, values in (("--samples", samples), ("--epochs", epochs)):
        if not values or any(v <= 0 for v in values):
            raise checks.UsageError(f"{flag} takes positive numbers, got {list(values)}")
    checks.at_least("--prompts_per_set", prompts_per_set, 1)
    checks.at_least("--gamma", gamma, 1)
    if want_tau <= 1:
        raise checks.UsageError(f"--want_tau is a mean tokens per round above 1, got {want_tau}")
    out_dir = Path(out)
    (out_dir / "arms").mkdir(parents=True, exist_ok=True)
    arms = sorted((dc.Arm(int(n), float(e)) for n in samples for e in epochs), key=lambda a: a.samples * a.epochs)
    batch = int(recipe.get("data", {}).get("batch_size", 4))
    if not report_only:
        work = Path(work_dir) if work_dir else out_dir / "runs"
        work.mkdir(parents=True, exist_ok=True)
        cli = [sys.executable, "-m", "dspark_lightning.cli"]
        print(f"[data-curve] preparing the recipe's data once (log: {work / 'prepare.log'})", flush=True)
        path = work / "recipe.yaml"
        path.write_text(yaml.safe_dump(recipe, sort_keys=False))
        _run([*cli, "prepare", "--config", str(path)], work / "prepare.log", "prepare")
        data_dir = Path(recipe.get("data", {}).get("work_dir", "outputs/data"))
        prompts = dc.heldout_prompts(data_dir / "responses_heldout.jsonl", prompts_per_set)
        for s, ps in prompts.items():
            if len(ps) < prompts_per_set:
                print(f"[data-curve] note: the held-out split has {len(ps)} {s} prompts (asked for {prompts_per_set})")
        check_samples(data_dir, max(samples))
        for arm in arms:
            dest = out_dir / "arms" / f"{arm.name}.json"
            if dest.is_file():
                continue
            res = run_arm(recipe, arm, work, prompts, gamma, max_new_tokens)
            atomic_write(dest, json.dumps(res.to_json(), indent=1) + "\n")
            taus = ", ".join(f"{s} {res.metric('tau', s):.3f}" for s in res.counts)
            print(f"[data-curve] {arm.name}: {res.steps:,} steps, τ {taus}", flush=True)
    results = [dc.ArmResult.from_json(json.loads(p.read_text())) for p in sorted((out_dir / "arms").glob("*.json"))]
    if not results:
        raise checks.UsageError(f"{out_dir / 'arms'} holds no finished arm yet")
    target = (recipe.get("target") or {}).get("name", "?")
    cpus = sorted({r.info.get("cpu", "?") for r in results})
    dates = sorted({r.info.get("date", "?") for r in results})
    names = " + ".join(Path(c).name for c in files)
    title = (f"{names} ({target}): T = 0, static γ = {gamma}, batch 1, {prompts_per_set} held-out prompts per set; "
             f"trained on {', '.join(cpus)}, {dates[0]}..{dates[-1]}")  # fmt: skip
    print(report(results, out_dir, want_tau, batch, fit_upto, title))
