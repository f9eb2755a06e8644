"""Data arms: the same drafter trained on differently prepared data, each prepared, trained and decoded in turn.

An arm is the base recipe plus the arm's overrides (nested dicts merged into the YAML; ``data.work_dir`` names its
data). For each arm the script

1. prepares the data (``dspark-lightning prepare``; timed, with prepare's own stage statistics),
2. trains a fixed number of optimizer steps (a step-based LR schedule, so the arms see the same schedule whatever
   else runs on the machine),
3. decodes the drafter with ``benchmarks/acceptance_probe.py`` (static γ, T = 0, the built-in eval sets),

and writes one row per arm: prompts and answers prepared, tokens answered, preparation wall and CPU time, training
steps, decoded A_1 / τ per set. ``--seed_from ARM=DIR`` starts an arm's work dir from another one's answers
(responses JSONL only), so an arm that changes only the feature stage does not answer the prompts again.

    python benchmarks/data_arms.py --cells benchmarks/data_arms_cells.yaml --steps 600 \
        --out benchmarks/results/data/data_arms [--only k1 k2 k4]
    python benchmarks/data_arms.py --report benchmarks/results/data/data_arms
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from matrix import commit, merge  # noqa: E402

from dspark_lightning.devices import cpu_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SETS = ("math", "code", "chat")


def _timed(cmd: list[str], log: Path) -> tuple[float, float]:
    """Run ``cmd`` from the repository root into ``log``; (wall seconds, CPU seconds of the child)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with open(log, "w") as f:
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if rc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed (exit {rc.returncode}); see {log}")
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def arm_recipe(base: dict, arm: dict, steps: int, run_dir: Path) -> dict:
    """The base recipe with the arm's overrides, trained for ``steps`` optimizer steps (no wall budget, no export)."""
    r = merge(base, arm.get("overrides", {}))
    r["trainer"].update(max_steps=steps, max_time=None, default_root_dir=str(run_dir))
    r["trainer"]["logger"] = [
        {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(run_dir), "name": "csv"}}
    ]
    r["trainer"]["callbacks"] = [c for c in r["trainer"].get("callbacks", []) if "ModelCheckpoint" not in str(c)]
    r["model"].setdefault("optim", {})["time_budget_s"] = None
    r["export"] = {"servers": []}
    return r


def seed_answers(src: Path, dst: Path) -> None:
    """Copy another work dir's merged answers into ``dst`` (prepare reuses those with the same prompt and settings)."""
    dst.mkdir(parents=True, exist_ok=True)
    for split in ("train", "heldout"):
        f = src / f"responses_{split}.jsonl"
        if f.is_file() and not (dst / f.name).exists():
            shutil.copy2(f, dst / f.name)


def count_rows(path: Path) -> tuple[int, int]:
    """(answers, distinct prompts) of a responses JSONL; ids of k answers per prompt are ``<id>#j``."""
    ids = [json.loads(line)["id"] for line in path.read_text().splitlines() if line.strip()]
    return len(ids), len({i.split("#")[0] for i in ids})


def run_arm(base: dict, arm: dict, steps: int, out: Path, probe_prompts: int) -> dict:
    name = arm["name"]
    run_dir = ROOT / "outputs" / "data_arms" / name
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    recipe = arm_recipe(base, arm, steps, run_dir)
    work = ROOT / recipe["data"]["work_dir"]
    if arm.get("seed_from"):
        seed_answers(ROOT / arm["seed_from"], work)
    path = run_dir / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    cli = [sys.executable, "-m", "dspark_lightning.cli"]
    prep_wall, prep_cpu = _timed([*cli, "prepare", "--config", str(path)], run_dir / "prepare.log")
    drafter = run_dir / "drafter"
    fit = [*cli, "fit", "--config", str(path), "--validate_before_fit", "false", "--export.dir", str(drafter)]
    fit_wall, _ = _timed(fit, run_dir / "fit.log")
    probe = run_dir / "acceptance"
    _timed([sys.executable, str(ROOT / "benchmarks/acceptance_probe.py"), "--drafter", str(run_dir / "drafter"),
            "--prompts_per_domain", str(probe_prompts), "--gammas", "7", "--temperatures", "0", "--out", str(probe)],
           run_dir / "probe.log")  # fmt: skip
    stats = json.loads(next(run_dir.glob("csv/version_*/fit_stats.json")).read_text())
    prep = json.loads((work / "prepare_stats.json").read_text()) if (work / "prepare_stats.json").exists() else {}
    answers, prompts = count_rows(work / "responses_train.jsonl")
    acc = {r["set"]: r for r in json.loads((probe / "acceptance.json").read_text())["rows"]}
    regen, feats = prep.get("regenerate_train", {}), prep.get("features_train", {})
    row = {
        "name": name,
        "what": arm.get("what", ""),
        "train_prompts": prompts,
        "train_answers": answers,
        "new_tokens": regen.get("tokens"),
        "regenerate_s": regen.get("wall_s"),
        "features_s": feats.get("wall_s"),
        "captured_samples": feats.get("captured_samples"),
        "samples": feats.get("samples"),
        "prepare_wall_s": round(prep_wall, 1),
        "prepare_cpu_s": round(prep_cpu, 1),
        "steps": stats["steps"],
        "fit_wall_s": round(fit_wall, 1),
        "A_1": {s: acc[s]["A_k"][0] for s in SETS if s in acc},
        "tau": {s: acc[s]["tau"] for s in SETS if s in acc},
        "drafter": str((run_dir / "drafter").relative_to(ROOT)),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(row, indent=2) + "\n")
    return row


def report(out: Path) -> str:
    info = json.loads((out / "run_info.json").read_text()) if (out / "run_info.json").exists() else {}
    rows = [json.loads(p.read_text()) for p in sorted(out.glob("*.json")) if p.name != "run_info.json"]
    rows.sort(key=lambda r: r.get("order", 0))
    lines = [
        f"Measured {info.get('date', '?')} on {info.get('cpu', '?')} ({info.get('cores', '?')} cores), commit "
        f"{info.get('commit', '?')}; {info.get('steps', '?')} training steps per arm; decoded at T = 0, static γ = 7, "
        f"{info.get('probe_prompts', '?')} prompts per set.",
        "",
        "| arm | what | prompts | answers | new tokens | prepare wall min | prepare CPU min | steps "
        "| A_1 math | A_1 code | A_1 chat | τ math | τ code | τ chat |",
        "|" + "---|" * 14,
    ]
    for r in rows:
        a, t = r["A_1"], r["tau"]
        cpu = "–" if r["prepare_cpu_s"] is None else f"{r['prepare_cpu_s'] / 60:.1f}"
        cells = [r["name"], r["what"], str(r["train_prompts"]), str(r["train_answers"]), f"{r['new_tokens'] or 0:,}",
                 f"{r['prepare_wall_s'] / 60:.1f}", cpu, str(r["steps"]),
                 *[f"{a.get(s, math.nan):.2f}" for s in SETS],
                 *[f"{t.get(s, math.nan):.2f}" for s in SETS]]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    (out / "data_arms.md").write_text(text)
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default=str(ROOT / "recipes/smollm2_dspark.yaml"))
    ap.add_argument("--cells", default=str(ROOT / "benchmarks/data_arms_cells.yaml"))
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--probe_prompts", type=int, default=10)
    ap.add_argument("--only", nargs="*", default=None, help="arm names to run (default: all)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/data/data_arms"))
    ap.add_argument("--report", action="store_true", help="only rebuild the table from --out")
    a = ap.parse_args()
    out = Path(a.out)
    if a.report:
        print(report(out))
        return
    base = yaml.safe_load(Path(a.base).read_text())
    arms = yaml.safe_load(Path(a.cells).read_text())
    unknown = set(a.only or []) - {c["name"] for c in arms}
    if unknown:
        raise SystemExit(f"unknown arms {sorted(unknown)}; known: {[c['name'] for c in arms]}")
    out.mkdir(parents=True, exist_ok=True)
    info = {"date": time.strftime("%Y-%m-%d"), "cpu": cpu_model(), "cores": os.cpu_count(), "commit": commit(),
            "steps": a.steps, "probe_prompts": a.probe_prompts}  # fmt: skip
    (out / "run_info.json").write_text(json.dumps(info, indent=2) + "\n")
    for order, arm in enumerate(arms):
        if a.only is not None and arm["name"] not in a.only:
            continue
        print(f"[data_arms] {arm['name']} ...", flush=True)
        row = run_arm(base, arm, a.steps, out, a.probe_prompts)
        row["order"] = order
        (out / f"{arm['name']}.json").write_text(json.dumps(row, indent=2) + "\n")
        print(json.dumps(row), flush=True)
    print(report(out))


if __name__ == "__main__":
    main()
