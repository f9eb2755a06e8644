"""Which verification length pays on this machine: every scheduler against plain decoding, prompt by prompt.

    .venv/bin/python benchmarks/sched_bench.py --drafter outputs/smollm2_dspark/tb/version_0/drafter \\
        --heldout outputs/smollm2_dspark/data/responses_heldout.jsonl --label make_run      (make sched-bench)

Decodes the first ``--per_set`` prompts per set (math / code / chat) of a recipe's held-out responses (the sources
it was trained on, prompts it never saw; data-curve's fixed order) with plain decoding, ``auto`` (the default),
``hardware_aware``, ``threshold:θ`` and ``static:γ``. At batch 1 every prompt is decoded by every method back to
back (the order rotating, so machine drift hits all alike); at batch B each group of B prompts is one call per
method. Writes ``<out>/sched_bench.json`` (rows ``{drafter, set, batch, T, method, tok_s, tau, speedup}``, speedup
over plain in the same run, and with 5 groups or more ``speedup_ci``, its 95 % bootstrap interval over the groups;
with the CPU, commit and date), ``sched_bench.md`` and ``sched_bench.png``. At T = 0
every method's output is compared with plain's (``greedy_equal``); so it is at T > 0 in the batches of
``--coupled_batches``, decoded with coupled acceptance (drafter-invariant outputs: a padded batch then runs
equally long for every method). Run it alone on the machine.
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

ROOT = Path(__file__).resolve().parents[1]


def methods(gammas: list[int], thresholds: list[float]) -> dict[str, object]:
    """Method label -> the ``scheduler`` argument of ``decode()`` (None: plain decoding)."""
    out: dict[str, object] = {"plain": None, "auto": "auto", "hardware_aware": "hardware_aware"}
    out |= {f"threshold:{t:g}": {"class_path": "threshold", "init_args": {"threshold": t}} for t in thresholds}
    out |= {f"static:{g}": {"class_path": "static", "init_args": {"gamma": g}} for g in gammas}
    return out


def run_set(target, drafter, prompts: list[str], *, batch: int, T: float, max_new_tokens: int,
            table: dict[str, object], acceptance: str = "rejection", repeats: int = 1) -> dict[str, dict]:  # fmt: skip
    """Every method on every group of ``batch`` prompts, back to back, the order rotating per group; each group
    ``repeats`` times (a repeat is one more paired sample of the speed-up, with the same seed)."""
    names = list(table)
    acc = {n: {"s": 0.0, "tokens": 0, "rounds": 0, "committed": 0, "equal": 0, "calls": 0, "groups": []}
           for n in names}  # fmt: skip
    groups = [prompts[i : i + batch] for i in range(0, len(prompts), batch)]
    runs = [(gi, group) for _ in range(repeats) for gi, group in enumerate(groups)]
    for ri, (gi, group) in enumerate(runs):
        order = names[ri % len(names) :] + names[: ri % len(names)]
        outs = {}
        for name in order:
            sched = table[name]
            t0 = time.perf_counter()
            res = decode(target, None if sched is None else drafter, group, max_new_tokens=max_new_tokens,
                         temperature=T, scheduler="static" if sched is None else sched, seed=gi,
                         batch_size=batch, acceptance=acceptance)  # fmt: skip
            a, seconds = acc[name], time.perf_counter() - t0
            a["s"] += seconds
            a["tokens"] += res.stats.generated_tokens
            a["groups"].append((seconds, res.stats.generated_tokens))
            a["rounds"] += res.stats.rounds
            a["committed"] += round(res.stats.tau * res.stats.rounds)
            a["calls"] += 1
            outs[name] = res.token_ids
        for name in names:
            acc[name]["equal"] += int(outs[name] == outs["plain"])
    return acc


def now() -> str:
    return datetime.datetime.now().isoformat(timespec="minutes")


def speedup_interval(method: list[tuple[float, int]], plain: list[tuple[float, int]], n: int = 2000,
                     seed: int = 0) -> list[float] | None:  # fmt: skip
    """95 % bootstrap interval of the speed-up over plain, resampling the groups (paired: a group's methods ran back
    to back); None for fewer than 5 groups."""
    if len(method) < 5:
        return None
    g = random.Random(seed)
    draws = []
    for _ in range(n):
        idx = [g.randrange(len(method)) for _ in method]
        mine = sum(method[i][1] for i in idx) / sum(method[i][0] for i in idx)
        base = sum(plain[i][1] for i in idx) / sum(plain[i][0] for i in idx)
        draws.append(mine / base)
    draws.sort()
    return [round(draws[int(0.025 * n)], 3), round(draws[int(0.975 * n) - 1], 3)]


def plot(rows: list[dict], path: Path) -> None:
    from dspark_lightning.plots import panel_grid, plt, save_figure

    keys = sorted({(r["drafter"], r["batch"], r["T"]) for r in rows})
    fig, axes = panel_grid(len(keys), panel=(6.0, 3.4))
    for ax, (drafter, batch, T) in zip(axes, keys, strict=False):
        sel = [r for r in rows if (r["drafter"], r["batch"], r["T"]) == (drafter, batch, T)]
        sets = sorted({r["set"] for r in sel})
        names = list(dict.fromkeys(r["method"] for r in sel))
        width = 0.8 / len(sets)
        for i, s in enumerate(sets):
            found = [next((r for r in sel if r["set"] == s and r["method"] == n), {}) for n in names]
            vals = [r.get("speedup", 0) for r in found]
            ci = [r.get("speedup_ci") or [r.get("speedup", 0)] * 2 for r in found]  # no interval: no bar
            err = [
                [v - lo for v, (lo, _) in zip(vals, ci, strict=True)],
                [hi - v for v, (_, hi) in zip(vals, ci, strict=True)],
            ]
            ax.bar([j + i * width for j in range(len(names))], vals, width=width, label=s, yerr=err, capsize=1.5,
                   error_kw={"lw": 0.6})  # fmt: skip
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))], names, rotation=60, fontsize=7)
        ax.set_ylabel("speed-up over plain")
        ax.set_title(f"{drafter}, batch {batch}, T = {T:g}", fontsize=9)
        ax.legend(fontsize=7)
    for ax in axes[len(keys) :]:
        ax.set_visible(False)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)


def markdown(rows: list[dict]) -> str:
    lines = ["| drafter | set | batch | T | method | tok/s | τ | speed-up | 95 % interval | output = plain |",
             "|---" * 10 + "|"]  # fmt: skip
    for r in rows:
        ci = "—" if "speedup_ci" not in r else f"{r['speedup_ci'][0]:.3f}–{r['speedup_ci'][1]:.3f}"
        lines.append(f"| {r['drafter']} | {r['set']} | {r['batch']} | {r['T']:g} | {r['method']} | {r['tok_s']:.1f} "
                     f"| {r['tau']:.2f} | {r['speedup']:.3f} | {ci} | {r.get('greedy_equal', '—')} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--label", required=True, help="the drafter's name in the rows (make_run, long)")
    ap.add_argument("--heldout", required=True, help="the recipe's <work_dir>/responses_heldout.jsonl")
    ap.add_argument("--per_set", type=int, default=10)
    ap.add_argument("--sets", nargs="+", default=["math", "code", "chat"])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--gammas", type=int, nargs="+", default=[1, 2, 3, 4, 7])
    ap.add_argument("--thresholds", type=float, nargs="+", default=[0.3])
    ap.add_argument("--max_new_tokens", type=int, default=128)
    ap.add_argument(
        "--coupled_batches",
        type=int,
        nargs="*",
        default=[8],
        help="batches whose T > 0 rows use coupled acceptance (every method emits plain's tokens, so a "
        "padded batch runs as long for each; rejection sampling's outputs differ per method)",
    )
    ap.add_argument(
        "--methods",
        nargs="*",
        default=None,
        help="a subset of the method labels (plain always runs); the other methods' rows of the file are kept",
    )
    ap.add_argument("--repeats", type=int, default=1, help="decode every group this many times (paired samples)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/data/sched_bench"))
    a = ap.parse_args()

    target, (drafter,) = load_target_and_drafters(None, [a.drafter])
    sets = heldout_prompts(a.heldout, a.per_set, tuple(a.sets))
    table = methods(a.gammas, a.thresholds)
    if a.methods:
        table = {k: v for k, v in table.items() if k in a.methods or k == "plain"}
    warm = next(iter(sets.values()))
    for T in a.temperatures:  # one-time profiles (kernels, SPS, drafting cost per sampling kind) before any timing
        for batch in a.batches:
            mode = "coupled" if T > 0 and batch in a.coupled_batches else "rejection"
            for sched in ("auto", "static"):
                decode(target, drafter, (warm * batch)[:batch], max_new_tokens=8, scheduler=sched, batch_size=batch,
                       temperature=T, acceptance=mode)  # fmt: skip
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "sched_bench.json"
    old = json.loads(path.read_text()) if path.is_file() else {}
    redo = {(a.label, float(T), b, s, m) for T in a.temperatures for b in a.batches for s in a.sets for m in table}
    rows = [
        r for r in old.get("rows", []) if (r["drafter"], float(r["T"]), r["batch"], r["set"], r["method"]) not in redo
    ]
    for T in a.temperatures:
        for batch in a.batches:
            for s, prompts in sets.items():
                mode = "coupled" if T > 0 and batch in a.coupled_batches else "rejection"
                acc = run_set(target, drafter, prompts, batch=batch, T=T, max_new_tokens=a.max_new_tokens,
                              table=table, acceptance=mode, repeats=a.repeats)  # fmt: skip
                plain = acc["plain"]["tokens"] / acc["plain"]["s"]
                for name, x in acc.items():
                    tok_s = x["tokens"] / x["s"]
                    tau = round(x["committed"] / x["rounds"], 3) if x["rounds"] else 1.0
                    row = {"drafter": a.label, "set": s, "batch": batch, "T": T, "method": name,
                           "tok_s": round(tok_s, 2), "tau": tau, "speedup": round(tok_s / plain, 3),
                           "prompts": len(prompts), "acceptance": mode, "calls": x["calls"],
                           "commit": commit.strip(), "when": now()}  # fmt: skip
                    if T == 0 or mode == "coupled":  # outputs that must equal plain's
                        row["greedy_equal"] = f"{x['equal']}/{x['calls']}"
                    interval = speedup_interval(x["groups"], acc["plain"]["groups"])
                    if interval and name != "plain":
                        row["speedup_ci"] = interval
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    doc = {
        "command": "benchmarks/sched_bench.py " + " ".join(f"--{k} {v}" for k, v in vars(a).items()),
        "cpu": cpu_model(),
        "threads": int(os.environ.get("OMP_NUM_THREADS", 0)) or os.cpu_count(),
        "commit": commit.strip(),
        "date": datetime.date.today().isoformat(),
        "max_new_tokens": a.max_new_tokens,
        "rows": rows,
    }
    atomic_write(path, json.dumps(doc, indent=1) + "\n")
    atomic_write(out / "sched_bench.md", markdown(rows) + "\n")
    plot(rows, out / "sched_bench.png")
    print(f"-> {path}")


if __name__ == "__main__":
    main()
