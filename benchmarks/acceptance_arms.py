"""More acceptance from the same conversations: one recipe change per arm, each trained on the same prepared
conversations for the same epochs and decoded on the same held-out prompts (data-curve's arm format).

    python benchmarks/acceptance_arms.py --arms baseline backbone2 vocab16k ... [--samples 1150 --epochs 3]

An arm is a YAML file ``benchmarks/acceptance_arms/<name>.yaml`` merged over ``--config`` (``make run``'s recipe by
default; ``baseline.yaml`` is empty). Every arm is trained by ``data-curve``'s runner (``fit`` in a subprocess,
``--samples`` conversations x ``--epochs``; no wall budget unless ``--minutes``: then each arm trains for that wall
budget, as ``make run`` does, or the epochs if they end first, and its steps are those it trained; run those alone)
and decoded at T = 0, static γ = 7, batch 1, 96 new
tokens on ``--per_set`` held-out prompts per set of the base recipe's split. A finished arm is a JSON file in
``--out``/arms (rerun to resume); ``arms.md`` is the table: steps, fit wall time, τ and A_1 per set with the 95 %
bootstrap interval over prompts, and the difference to the baseline. An arm that changes the data (answer length,
turns, taps) prepares its own work_dir first; that preparation is not counted in the fit's wall time.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dspark_lightning.atomic import atomic_write  # noqa: E402
from dspark_lightning.cli.data_curve import _merged, _run, check_samples, run_arm  # noqa: E402
from dspark_lightning.eval import data_curve as dc  # noqa: E402

SETS = ("math", "code", "chat")
ARMS = ROOT / "benchmarks" / "acceptance_arms"


def table(results: dict[str, dc.ArmResult], boot: int = 500) -> str:
    rng = np.random.default_rng(0)
    base = results.get("baseline")
    head = "| arm | change | steps | fit min | " + " | ".join(f"τ {s}" for s in SETS) + " | "
    head += " | ".join(f"A_1 {s}" for s in SETS) + " |"
    lines = [head, "|" + "---|" * (4 + 2 * len(SETS))]
    for name, r in results.items():
        change = r.info.get("change", "")
        cells = [name, change, f"{r.steps:,}", f"{r.info.get('fit_wall_s', 0) / 60:.1f}"]
        for metric in ("tau", "A_1"):
            for s in SETS:
                size = len(r.counts[s])
                ys = [r.metric(metric, s, rng.integers(0, size, size)) for _ in range(boot)]
                lo, hi = np.percentile(ys, [2.5, 97.5])
                cell = f"{r.metric(metric, s):.3f} [{lo:.2f}, {hi:.2f}]"
                if base is not None and name != "baseline":  # paired over the same prompts
                    d = [r.metric(metric, s, i) - base.metric(metric, s, i)
                         for i in (rng.integers(0, size, size) for _ in range(boot))]  # fmt: skip
                    dlo, dhi = np.percentile(d, [2.5, 97.5])
                    cell += f" (Δ {r.metric(metric, s) - base.metric(metric, s):+.3f} [{dlo:+.2f}, {dhi:+.2f}])"
                cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arms", nargs="+", required=True, help=f"names of YAML files in {ARMS.relative_to(ROOT)}")
    ap.add_argument("--config", default=str(ROOT / "recipes/smollm2_dspark.yaml"))
    ap.add_argument("--samples", type=int, default=1150)
    ap.add_argument("--epochs", type=float, default=3.0)
    ap.add_argument("--minutes", type=float, default=None, help="a wall budget per arm's training (alone only)")
    ap.add_argument("--per_set", type=int, default=30)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/data/acceptance_arms"))
    ap.add_argument("--work_dir", default="outputs/acceptance_arms")
    a = ap.parse_args()

    base = yaml.safe_load(Path(a.config).read_text())
    out = Path(a.out)
    (out / "arms").mkdir(parents=True, exist_ok=True)
    prompts = dc.heldout_prompts(Path(base["data"]["work_dir"]) / "responses_heldout.jsonl", a.per_set)
    arm = dc.Arm(a.samples, a.epochs)
    for name in a.arms:
        dest = out / "arms" / f"{name}.json"
        if dest.is_file():
            continue
        over = yaml.safe_load((ARMS / f"{name}.yaml").read_text()) or {}
        change = over.pop("change", "")
        recipe = _merged(base, over)
        work = Path(a.work_dir) / name
        work.mkdir(parents=True, exist_ok=True)
        data_dir = Path(recipe["data"]["work_dir"])
        if data_dir != Path(base["data"]["work_dir"]):  # an arm with its own data prepares it first
            path = work / "recipe.yaml"
            path.write_text(yaml.safe_dump(recipe, sort_keys=False))
            print(f"[arms] {name}: preparing {data_dir} (log: {work / 'prepare.log'})", flush=True)
            _run([sys.executable, "-m", "dspark_lightning.cli", "prepare", "--config", str(path)],
                 work / "prepare.log", f"prepare of arm {name}")  # fmt: skip
        check_samples(data_dir, a.samples)
        res = run_arm(recipe, arm, work, prompts, 7, 96, a.minutes)
        res.info["change"] = change
        atomic_write(dest, json.dumps(res.to_json(), indent=1) + "\n")
        print(f"[arms] {name}: " + ", ".join(f"τ {s} {res.metric('tau', s):.3f}" for s in SETS), flush=True)
    results = {}  # every finished arm in --out, not only this run's: the table is the study's
    finished = sorted((p.stem for p in (out / "arms").glob("*.json")), key=lambda n: (n != "baseline", n))
    for name in finished:
        results[name] = dc.ArmResult.from_json(json.loads((out / "arms" / f"{name}.json").read_text()))
    done = list(results.values())
    budget = f" or {a.minutes:g} wall minutes of training" if a.minutes else ""
    title = (f"{Path(a.config).name} + one change per arm, {a.samples:,} conversations x {a.epochs:g} epochs{budget}; "
             f"T = 0, static γ = 7, batch 1, 96 new tokens, {a.per_set} held-out prompts per set; "
             f"CPU {', '.join(sorted({r.info.get('cpu', '?') for r in done}))}; "
             f"{', '.join(sorted({str(r.info.get('date')) for r in done}))}")  # fmt: skip
    atomic_write(out / "arms.md", title + "\n\n" + table(results) + "\n")
    print(table(results))


if __name__ == "__main__":
    main()
