"""Markdown tables and PNG plots for ``eval`` and ``bench`` (matplotlib imported lazily)."""

from __future__ import annotations

from pathlib import Path


def _f(v, spec: str = ".2f") -> str:
    return "–" if v is None else format(v, spec)


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(r) + " |" for r in rows)]


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
    lines += _table(["engine", *ds], rows)
    lines += ["", "Draft acceptance rate α (bonus excluded):", ""]
    lines += _table(["drafter", *ds], [[n, *(_f(doc["acceptance_rate"][n][c], ".3f") for c in ds)] for n in names])
    return "\n".join(lines)


def plot_acceptance(acceptance: dict, path: str | Path, title: str = "") -> Path:
    """Conditional acceptance A_k against block position, one panel per dataset (the paper's Figure 2)."""
    from ..plots import plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    names = list(acceptance)
    datasets = list(next(iter(acceptance.values()))) if names else []
    fig, axes = plt.subplots(1, max(1, len(datasets)), figsize=(4.2 * max(1, len(datasets)), 3.6), squeeze=False)
    for ax, ds in zip(axes[0], datasets, strict=False):
        for n in names:
            a = acceptance[n][ds]["conditional_acceptance"]
            ks = [k + 1 for k, v in enumerate(a) if v is not None]
            ax.plot(ks, [v for v in a if v is not None], "o-", ms=4, label=n)
        ax.set_title(f"{ds} ({acceptance[names[0]][ds]['domain']})")
        ax.set_xlabel("block position k")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("conditional acceptance A_k")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def bench_markdown(doc: dict) -> str:
    info = doc["info"]
    lines = [
        f"Throughput on {info['target']} ({info['threads']} threads, {info['machine']}), ≤ {info['max_new_tokens']} "
        f"new tokens, {info['repeats']} alternating repeat(s) per cell (tok/s = total generated tokens / total time, "
        "prefill included). Speedups are against HF generate() and against our plain decoding in the same cell; "
        "efficiency = speedup over our plain / τ.",
        "",
    ]
    head = ["T", "batch", "prompts", "engine", "tok/s", "vs HF", "vs plain", "τ", "efficiency", "mean ℓ", "greedy = HF"]
    rows = []
    for r in doc["rows"]:
        eq = {True: "yes", False: "NO"}.get(r.get("equals_hf"), "")
        rows.append(
            [
                f"{r['temperature']:g}",
                str(r["batch"]),
                r["prompt_set"],
                r["engine"],
                _f(r.get("tok_s")),
                _f(r.get("speedup_vs_hf"), ".2f") + ("×" if r.get("speedup_vs_hf") else ""),
                _f(r.get("speedup_vs_plain"), ".2f") + ("×" if r.get("speedup_vs_plain") else ""),
                _f(r.get("tau"), ".3f"),
                _f(r.get("efficiency"), ".2f"),
                _f(r.get("mean_verify_len"), ".2f"),
                eq if r.get("tok_s") is not None else r.get("note", ""),
            ]
        )
    return "\n".join(lines + _table(head, rows))


def plot_reliability(z, m, ell, temps_before, temps_after, out_dir: str | Path, title: str = "") -> list[Path]:
    """One reliability diagram per block position (the paper's Figure 6): survival p_k against realised
    prefix acceptance in 20 equal-width bins, raw and after STS, with the bin counts."""
    import torch

    from ..calibration import N_BINS, survival_probs
    from ..plots import plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    before, after = survival_probs(z, torch.as_tensor(temps_before)), survival_probs(z, torch.as_tensor(temps_after))
    for k in range(z.shape[1]):
        rows = ell >= k + 1
        y = (m[rows] >= k + 1).double()
        fig, (ax, axc) = plt.subplots(2, 1, figsize=(4.2, 4.8), sharex=True, height_ratios=[3, 1])
        ax.plot([0, 1], [0, 1], "k--", lw=0.8, label="perfect")
        for p_all, label in ((before, "raw"), (after, "STS")):
            p = p_all[rows, k]
            b = (p * N_BINS).floor().long().clamp(max=N_BINS - 1)
            n = torch.bincount(b, minlength=N_BINS)
            mp = torch.bincount(b, weights=p, minlength=N_BINS) / n.clamp(min=1)
            my = torch.bincount(b, weights=y, minlength=N_BINS) / n.clamp(min=1)
            keep = n > 0
            ax.plot(mp[keep].tolist(), my[keep].tolist(), "o-", ms=3, label=label)
            centers = ((torch.arange(N_BINS) + 0.5) / N_BINS).tolist()
            axc.bar(centers, n.tolist(), width=1 / N_BINS, alpha=0.5, label=label)
        ax.set_ylabel("realised survival")
        ax.set_title(f"position {k + 1} ({int(rows.sum())} rounds) {title}", fontsize=9)
        ax.legend(fontsize=7)
        axc.set_xlabel("predicted survival a_k")
        axc.set_ylabel("rounds")
        axc.set_yscale("log")
        fig.tight_layout()
        path = out_dir / f"reliability_pos{k + 1}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
