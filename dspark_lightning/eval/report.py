"""Markdown tables and PNG plots for ``eval``, ``bench`` and ``serve-bench`` (matplotlib imported lazily); the
calibration report is :mod:`dspark_lightning.calibration.report`."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from ..atomic import atomic_write
from ..markdown import cell as _f
from ..markdown import table as _table

MIN_DRAFTS_FOR_ALPHA = 20  # the threshold sweep plots α only where at least this many drafts were verified


def write_outputs(doc: dict, out: str | Path, files: dict[str, Callable | None]) -> dict[str, Path]:
    """Write a command's files into ``out``: ``*.json`` is the document itself, ``*.md`` is ``files[name](doc)``,
    anything else (plots) is written by ``files[name](doc, path)``. Each file replaces its previous version
    atomically (a full disk leaves the previous one as it was)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, make in files.items():
        path = paths[name] = out / name
        if name.endswith(".json"):
            atomic_write(path, json.dumps(doc, indent=1) + "\n")
        elif name.endswith(".md"):
            atomic_write(path, make(doc) + "\n")
        else:
            make(doc, path)
    return paths


def save_plot(fig, path: str | Path, dpi: int = 120) -> Path:
    """Lay ``fig`` out, write it to ``path`` whole or not at all, and close it."""
    from ..plots import plt, save_figure

    fig.tight_layout()
    save_figure(fig, path, dpi=dpi)
    plt.close(fig)
    return Path(path)


def eval_markdown(doc: dict) -> str:
    info, names = doc["info"], list(doc["tau"])
    ds = [d["name"] for d in doc["datasets"]]
    domains = list(dict.fromkeys(d["domain"] for d in doc["datasets"]))
    lines = [
        f"τ (accepted length, bonus included; pooled over rounds) on {info['target']}, T = {info['temperature']:g}, "
        f"scheduler {info['scheduler']}, ≤ {info['max_new_tokens']} new tokens, batch {info['batch_size']}, "
        f"seed {info['seed']}; prompts per dataset: "
        + ", ".join(f"{d['name']} {d['prompts']}" for d in doc["datasets"]),
        "",
    ]
    head = ["drafter", *(f"{n} ({d['domain']})" for n, d in zip(ds, doc["datasets"], strict=True))]
    head += [f"{dom} mean" for dom in domains] + ["macro"]
    best = {c: max(doc["tau"][n][c] for n in names) for c in ds}
    rows = []
    for n in names:
        cells = [n] + [("**%.3f**" if doc["tau"][n][c] == best[c] else "%.3f") % doc["tau"][n][c] for c in ds]
        cells += [f"{doc['domain_tau'][n][dom]:.3f}" for dom in domains] + [f"{doc['macro_tau'][n]:.3f}"]
        rows.append(cells)
    lines += _table(head, rows)
    if len(names) > 1:
        lines += ["", "Macro-average τ relative to each other drafter (row over column − 1):", ""]
        m = doc["macro_tau"]
        lines += _table(["", *names], [[a, *(f"{m[a] / m[b] - 1:+.1%}" for b in names)] for a in names])
    lines += ["", "Tokens/s (prefill included) and speedup over plain decoding of the same target in the same run:", ""]
    tok, sp = doc["tokens_per_s"], doc["speedup_vs_plain"]
    rows = [["plain", *(f"{tok['plain'][c]:.2f}" for c in ds)]]
    rows += [[n, *(f"{tok[n][c]:.2f} ({sp[n][c]:.2f}×)" for c in ds)] for n in names]
    lines += _table(["decoder", *ds], rows)
    lines += ["", "Draft acceptance rate α (bonus excluded):", ""]
    lines += _table(["drafter", *ds], [[n, *(_f(doc["acceptance_rate"][n][c], ".3f") for c in ds)] for n in names])
    return "\n".join(lines)


def acceptance_figure(acceptance: dict, title: str = ""):
    """Conditional acceptance A_k against block position k (the paper's Figure 2): one panel per dataset in rows of
    at most :data:`~dspark_lightning.plots.MAX_COLUMNS`, one line per drafter, whole-number positions."""
    from ..plots import integer_ticks, panel_grid

    names = list(acceptance)
    datasets = list(next(iter(acceptance.values()))) if names else []
    fig, axes = panel_grid(len(datasets))
    last = 1
    for ax, ds in zip(axes, datasets, strict=False):
        for n in names:
            a = acceptance[n][ds]["conditional_acceptance"]
            ks = [k + 1 for k, v in enumerate(a) if v is not None]
            ax.plot(ks, [v for v in a if v is not None], "o-", ms=4, label=n)
            last = max(last, len(a))
        ax.set_title(f"{ds} ({acceptance[names[0]][ds]['domain']})")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    cols = axes[0].get_subplotspec().get_gridspec().ncols
    for i, ax in enumerate(axes):
        integer_ticks(ax, last)
        if i % cols == 0:
            ax.set_ylabel("conditional acceptance A_k")
        if i >= len(axes) - cols:  # the bottom panel of each column
            ax.set_xlabel("block position k")
    if names:
        axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_acceptance(acceptance: dict, path: str | Path, title: str = "") -> Path:
    """:func:`acceptance_figure` as a PNG."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return save_plot(acceptance_figure(acceptance, title), path)


def _step_ms(ms: dict | None) -> str:
    return "" if not ms else f"{ms['draft']:.1f} · {ms['verify']:.1f}"


def bench_markdown(doc: dict) -> str:
    info = doc["info"]
    lines = [
        f"Throughput on {info['target']} ({info['threads']} threads, {info['machine']}), ≤ {info['max_new_tokens']} "
        f"new tokens, {info['repeats']} alternating repeat(s) per cell (tok/s = total generated tokens / total time, "
        "prefill included). Speedups are against HF generate() and against our plain decoding in the same cell; "
        "efficiency = speedup over our plain / τ; skipped drafts = steps where the scheduler did not run the drafter; "
        "ms/step = drafting (incl. the context-cache update) and verification time per batched step.",
        "",
    ]
    head = ["T", "batch", "prompts", "decoder", "tok/s", "vs HF", "vs plain", "τ", "efficiency", "mean ℓ",
            "skipped drafts", "ms/step draft · verify", "greedy = HF"]  # fmt: skip
    rows = []
    for r in doc["rows"]:
        eq = {True: "yes", False: "NO"}.get(r.get("equals_hf"), "")
        rows.append(
            [
                f"{r['temperature']:g}",
                str(r["batch"]),
                r["prompt_set"],
                r["decoder"],
                _f(r.get("tok_s")),
                _f(r.get("speedup_vs_hf"), ".2f") + ("×" if r.get("speedup_vs_hf") else ""),
                _f(r.get("speedup_vs_plain"), ".2f") + ("×" if r.get("speedup_vs_plain") else ""),
                _f(r.get("tau"), ".3f"),
                _f(r.get("efficiency"), ".2f"),
                _f(r.get("mean_verify_len"), ".2f"),
                f"{r['skipped_steps']}/{r['steps']}" if r.get("tau") is not None and "steps" in r else "",
                _step_ms(r.get("ms_per_step")),
                eq if r.get("tok_s") is not None else r.get("note", ""),
            ]
        )
    lines += _table(head, rows)
    drafted = [r for r in doc["rows"] if r.get("tau") is not None and r.get("survival") is not None]
    if drafted:
        lines += ["", "Per-position acceptance (k = 1..γ, first repeat): survival S_k, conditional A_k", ""]
        lines += _table(["T", "batch", "prompts", "decoder", "S_k", "A_k"], [[
            f"{r['temperature']:g}", str(r["batch"]), r["prompt_set"], r["decoder"],
            " ".join(_f(v) for v in r["survival"]), " ".join(_f(v) for v in r["conditional_acceptance"]),
        ] for r in drafted])  # fmt: skip
    return "\n".join(lines)


def serve_markdown(doc: dict) -> str:
    """Every cell of the serving study, then the scheduler comparison per concurrency."""
    info, rows = doc["info"], doc["rows"]
    lines = [
        f"Closed-loop serving on {info['target']} ({info['threads']} threads), T = {info['temperature']:g}, "
        f"≤ {info['max_new_tokens']} new tokens per request, {info['prompts']} prompts cycled, a "
        f"{info['window_s']:g} s window per cell, {info.get('repeats', 1)} run(s) per cell (mean; min–max in "
        "brackets). Per-user tok/s excludes TTFT; ℓ = verified drafts per "
        "request-round; B = tokens per target forward; draft/verify = share of the window's wall time.",
        "",
    ]
    head = ["N", "method", "aggregate tok/s", "per-user tok/s", "mean ℓ", "mean B", "τ", "α", "draft", "verify",
            "draft ms/step", "verify ms/step", "SPS table ms at B"]  # fmt: skip
    lines += _table(head, [[
        str(r["concurrency"]), r["method"], f"{r['aggregate_tok_s']:.2f}{_spread(r['runs_aggregate_tok_s'])}",
        _f(r["per_user_tok_s"]),
        f"{r['mean_verify_len']:.2f}", f"{r['mean_step_tokens']:.1f}", _f(r["tau"], ".3f"),
        _f(r["acceptance_rate"], ".3f"), f"{r['draft_share']:.0%}", f"{r['verify_share']:.0%}",
        _f(r.get("draft_ms_per_step"), ".0f"), _f(r.get("verify_ms_per_step"), ".0f"), _f(r.get("sps_table_ms"), ".0f"),
    ] for r in rows])  # fmt: skip
    by = {(r["concurrency"], r["method"]): r for r in rows}
    statics = [m for m in doc["methods"] if m.startswith("static")]
    adaptive = [m for m in doc["methods"] if "hardware_aware" in m]
    if statics and adaptive:
        full = max(statics, key=lambda m: int(m.partition(":")[2] or 10**6))
        lines += ["", f"Aggregate tok/s of the load-aware schedulers against the best static γ and {full}:", ""]
        head = ["N", "best static", *(f"{m} (vs best static, vs {full})" for m in adaptive)]
        out = []
        for n in doc["concurrency"]:
            best = max(statics, key=lambda m: by[(n, m)]["aggregate_tok_s"])
            b, f = by[(n, best)]["aggregate_tok_s"], by[(n, full)]["aggregate_tok_s"]
            cells = [f"{by[(n, m)]['aggregate_tok_s']:.2f} ({by[(n, m)]['aggregate_tok_s'] / b:.2f}×, "
                     f"{by[(n, m)]['aggregate_tok_s'] / f:.2f}×)" for m in adaptive]  # fmt: skip
            out.append([str(n), f"{best} {b:.2f}", *cells])
        lines += _table(head, out)
    return "\n".join(lines)


def _spread(runs: list[float]) -> str:
    return f" ({min(runs):.1f}–{max(runs):.1f})" if len(runs) > 1 else ""


def _by_method(doc: dict) -> dict[str, list[dict]]:
    return {m: sorted((r for r in doc["rows"] if r["method"] == m), key=lambda r: r["concurrency"])
            for m in doc["methods"]}  # fmt: skip


def plot_frontier(doc: dict, path: str | Path) -> Path:
    """Aggregate throughput against per-user speed, one line per method through N = 1, 2, 4, ... (Figure 7)."""
    from ..plots import plt

    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    for i, (m, rs) in enumerate(_by_method(doc).items()):
        rs = [r for r in rs if r["per_user_tok_s"] is not None]
        style = "-" if "hardware_aware" in m or m == "plain" else "--"
        x, y = [r["per_user_tok_s"] for r in rs], [r["aggregate_tok_s"] for r in rs]
        ax.plot(x, y, style, color=f"C{i}", marker="o", ms=4, label=m)
        for r in rs:
            ax.annotate(str(r["concurrency"]), (r["per_user_tok_s"], r["aggregate_tok_s"]), fontsize=6,
                        xytext=(3, 2), textcoords="offset points")  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("per-user tokens/s (TTFT excluded)")
    ax.set_ylabel("aggregate tokens/s")
    ax.set_title(f"{doc['info']['target']}: throughput vs per-user speed (labels: concurrency)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save_plot(fig, path)


def plot_budget(doc: dict, path: str | Path) -> Path:
    """Verified drafts per request-round, and tokens per target forward, against concurrency (Figure 8)."""
    from ..plots import plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9.6, 3.8))
    for i, (m, rs) in enumerate(_by_method(doc).items()):
        ns = [r["concurrency"] for r in rs]
        style = "-" if "hardware_aware" in m or m.startswith("threshold") or m == "plain" else "--"
        kw = {"color": f"C{i}", "marker": "o", "ms": 4, "label": m}  # the frontier plot's colours
        if m != "plain":  # plain verifies no draft: only its B = N line is drawn
            a1.plot(ns, [r["mean_verify_len"] for r in rs], style, **kw)
        a2.plot(ns, [r["mean_step_tokens"] for r in rs], style, **kw)
    for ax, label in ((a1, "mean verified drafts ℓ per request-round"), (a2, "tokens per target forward B")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency N")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    a2.set_yscale("log", base=2)
    a1.legend(fontsize=7)
    fig.suptitle(f"{doc['info']['target']}: verification budget against load", fontsize=9)
    return save_plot(fig, path)


def sweep_markdown(doc: dict) -> str:
    info = doc["info"]
    lines = [
        f"Threshold sweep on {info['target']}, T = {info['temperature']:g}, {info['mode']} rule "
        f"({'calibrated' if info['calibrated'] else 'raw'} confidences), ≤ {info['max_new_tokens']} new tokens, "
        f"batch {info['batch_size']}. Per request-round: verified drafts ℓ = accepted m + rejected; α = Σm/Σℓ over the "
        "(number of) verified drafts.",
        "",
    ]
    head = ["domain", "θ", "verified/round", "accepted/round", "rejected/round", "α (drafts)", "τ", "rounds with ℓ = 0"]
    lines += _table(head, [[
        r["domain"], f"{r['threshold']:g}", f"{r['verified_per_round']:.2f}", f"{r['accepted_per_round']:.2f}",
        f"{r['rejected_per_round']:.2f}", f"{_f(r['acceptance_rate'], '.1%')} ({r['verified_drafts']})",
        f"{r['tau']:.3f}",
        f"{r['skipped_rounds']:.0%}",
    ] for r in doc["rows"]])  # fmt: skip
    return "\n".join(lines)


def plot_threshold_sweep(doc: dict, path: str | Path) -> Path:
    """Stacked accepted/rejected drafts per round against θ with α on a second axis, per domain (Figure 5)."""
    from ..plots import plt

    domains = list(dict.fromkeys(r["domain"] for r in doc["rows"]))
    fig, axes = plt.subplots(1, len(domains), figsize=(4.2 * len(domains), 3.6), squeeze=False)
    for ax, dom in zip(axes[0], domains, strict=True):
        rs = [r for r in doc["rows"] if r["domain"] == dom]
        th = [r["threshold"] for r in rs]
        acc, rej = [r["accepted_per_round"] for r in rs], [r["rejected_per_round"] for r in rs]
        w = 0.8 * (min(b - a for a, b in zip(th, th[1:], strict=False)) if len(th) > 1 else 0.1)
        ax.bar(th, acc, width=w, color="tab:green", label="accepted")
        ax.bar(th, rej, width=w, bottom=acc, color="tab:red", alpha=0.6, label="rejected")
        ax.set_xlabel("threshold θ")
        ax.set_title(dom)
        ax2 = ax.twinx()
        pts = [
            (t, r["acceptance_rate"])
            for t, r in zip(th, rs, strict=True)
            if r["verified_drafts"] >= MIN_DRAFTS_FOR_ALPHA
        ]
        ax2.plot([t for t, _ in pts], [a for _, a in pts], "ko-", ms=3, label=f"α (≥ {MIN_DRAFTS_FOR_ALPHA} drafts)")
        ax2.set_ylim(0, 1)
        ax2.set_ylabel("acceptance rate α")
    axes[0][0].set_ylabel("verified drafts per round")
    axes[0][0].legend(fontsize=7, loc="upper right")
    ax2.legend(fontsize=7, loc="upper right")
    fig.suptitle(f"{doc['info']['target']}: threshold sweep ({doc['info']['mode']} rule)", fontsize=9)
    return save_plot(fig, path)
