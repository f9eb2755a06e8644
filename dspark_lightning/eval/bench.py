"""``dspark-lightning bench``: side-by-side throughput of what a user could run on the same target.

Decoders, in one process on one prompt set: HF ``generate()``, HF ``generate()`` with prompt-lookup
decoding, our plain decoding, and our decoding with each drafter. Cells: temperature x batch size;
at batch 1 every domain is its own prompt set (per-domain speed), at larger batches the domains are
mixed. Within a cell the decoders run one after another and each repeat reverses the order
(A B C, C B A, ...), so slow drift of the machine hits every decoder alike; tok/s pools tokens and
time over the repeats. Several schedulers (`--scheduler static hardware_aware`) give one row per drafter and
scheduler, both batching modes (`--batching padded flat`) one row per decoder of ours and mode, all in the
same alternation.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .hf import hf_generate
from .runner import drafter_dtype_name, run_decode, run_info, scheduler_label, warmup

HF, HF_PLD, PLAIN = "HF generate", "HF prompt lookup", "plain decode()"
PLAIN_HF = "plain decode(), HF forward"
COUPLED = (
    "{} [coupled]"  # a row under coupled acceptance  # our loop with the HF verifier: what the lean verifier gains
)
OUTPUT_FILES = {
    "bench.json": "run info and one row per cell x decoder (tok/s, speedups, τ, efficiency, time split)",
    "bench.md": "the same as a Markdown table",
    "bench.png": "tok/s per decoder, one panel per cell",
}


def _hf(target, prompts, T, batch, max_new, seed, lookup: int | None) -> dict:
    kw = {} if lookup is None else {"prompt_lookup_num_tokens": lookup}
    try:
        r = hf_generate(target, prompts, max_new, temperature=T, batch_size=batch, seed=seed, **kw)
    except ValueError as exc:  # assisted generation (prompt lookup) is batch-1 only in transformers
        return {"unsupported": str(exc).splitlines()[0][:160]}
    return {**r, "tok_s": r["generated_tokens"] / r["time_s"]}


@dataclass(frozen=True)
class Decoder:
    """One row name of a cell: what runs (HF generate, HF prompt lookup or our decode()) and with what."""

    name: str
    kind: str = "ours"  # "hf" | "hf_lookup" | "ours"
    drafter: str | None = None  # a key of ``drafters``; None: plain decoding
    scheduler: Any = "static"
    scheduler_label: str | None = None
    batching: str = "padded"
    verifier: str = "auto"
    acceptance: str = "rejection"
    plain: str = PLAIN  # the row ``speedup_vs_plain`` divides by: our plain decoding in the same batching mode


def decoders(
    drafters, schedulers: dict[str, Any], batching: tuple[str, ...] = ("padded",), coupled: bool = False
) -> list[Decoder]:
    """The decoders of every cell. One scheduler and one batching mode: ``HF generate``, ``HF prompt lookup``, ``plain
    decode(), HF forward``, ``plain decode()``, one row per drafter. Several schedulers: one row per drafter and
    scheduler, ``<drafter> [<scheduler>]``; several batching modes: our decoders once per mode, ``... [<mode>]``.
    ``coupled``: plain decoding and each drafter again under coupled acceptance, ``... [coupled]`` (T > 0 only)."""
    many_s, many_l = len(schedulers) > 1, len(batching) > 1
    first_plain = PLAIN + (f" [{batching[0]}]" if many_l else "")
    out = [Decoder(HF, "hf", plain=first_plain), Decoder(HF_PLD, "hf_lookup", plain=first_plain)]
    extra = []
    for mode in batching:
        at = f" [{mode}]" if many_l else ""
        plain = PLAIN + at
        ours = [Decoder(PLAIN + at, batching=mode, plain=plain)]
        for d in drafters:
            for label, spec in schedulers.items():
                name = d + (f" [{label}]" if many_s else "") + at
                ours.append(Decoder(name, drafter=d, scheduler=spec, scheduler_label=label, batching=mode, plain=plain))
        out += [Decoder(PLAIN_HF + at, batching=mode, verifier="hf", plain=plain), *ours]
        if coupled:
            extra += [replace(e, name=COUPLED.format(e.name), acceptance="coupled") for e in ours]
    return out + extra


def bench(
    target,
    drafters: dict[str, Any],
    prompt_sets: dict[str, list[str]],
    *,
    temperatures: tuple[float, ...] = (0.0, 1.0),
    batches: tuple[int, ...] = (1, 8),
    max_new_tokens: int = 64,
    repeats: int = 2,
    scheduler: Any = "hardware_aware",
    seed: int = 0,
    prompt_lookup_tokens: int = 10,
    acceptance: tuple[str, ...] = ("rejection",),
    schedulers: dict[str, Any] | None = None,
    batching: tuple[str, ...] = ("padded",),
    progress: bool = True,
) -> dict:
    """tok/s of HF generate(), HF prompt lookup, plain decode() (lean and HF forward) and each drafter, per cell
    (temperature, batch, prompt set), alternating ``repeats``; ``acceptance`` with ``coupled`` adds, at T > 0, plain
    decoding and each drafter under coupled acceptance (rows named ``... [coupled]``, compared with the same HF and
    plain rows). ``schedulers`` (label -> spec, instead of ``scheduler``): every drafter under each of them;
    ``batching``: our decoders in each batching mode (padded, flat), alternated within the cell like the rest."""
    from tqdm.auto import tqdm

    schedulers = schedulers or {scheduler_label(scheduler): scheduler}
    ids = {k: [target.encode_prompt(p) for p in v] for k, v in prompt_sets.items()}
    mixed = [p for v in ids.values() for p in v]
    every = decoders(drafters, schedulers, tuple(batching), "coupled" in acceptance)
    cells = [(T, b, s) for T in temperatures for b in batches for s in (ids if b == 1 else ["all"])]
    for spec in schedulers.values():
        warmup(target, drafters, spec)
    _hf(target, mixed[:1], 1.0, 1, 4, seed, prompt_lookup_tokens)
    runs = sum(len([e for e in every if T > 0 or e.acceptance != "coupled"]) for T, _, _ in cells) * repeats
    bar = tqdm(total=runs, desc="bench", unit="run", disable=not progress)
    rows = []
    for T, batch, pset in cells:
        prompts = ids[pset] if pset != "all" else mixed
        here = [e for e in every if T > 0 or e.acceptance != "coupled"]  # greedy is the same in both modes
        acc: dict[str, list[dict]] = {e.name: [] for e in here}
        for rep in range(repeats):
            for e in here if rep % 2 == 0 else here[::-1]:
                bar.set_postfix_str(f"T={T:g} b={batch} {pset}: {e.name}")
                if e.kind != "ours":
                    lookup = prompt_lookup_tokens if e.kind == "hf_lookup" else None
                    r = _hf(target, prompts, T, batch, max_new_tokens, seed, lookup)
                else:
                    d = drafters.get(e.drafter) if e.drafter is not None else None
                    r = run_decode(
                        target,
                        d,
                        prompts,
                        temperature=T,
                        batch_size=batch,
                        scheduler=e.scheduler if d is not None else "static",
                        max_new_tokens=max_new_tokens,
                        seed=seed,
                        verifier=e.verifier,
                        acceptance=e.acceptance,
                        batching=e.batching,
                    )
                acc[e.name].append(r)
                bar.update()
        rows += _cell_rows(acc, {e.name: e for e in here}, T, batch, pset, len(prompts))
    bar.close()
    one = next(iter(schedulers)) if len(schedulers) == 1 else None
    info = run_info(
        target,
        max_new_tokens=max_new_tokens,
        repeats=repeats,
        scheduler=one if one is not None else list(schedulers),
        batching=list(batching),
        acceptance=list(acceptance),
        seed=seed,
        prompt_lookup_tokens=prompt_lookup_tokens,
        prompt_sets={k: len(v) for k, v in prompt_sets.items()},
        drafters={n: getattr(d, "source_dir", None) for n, d in drafters.items()},
        drafter_dtypes={n: drafter_dtype_name(d) for n, d in drafters.items() if d is not None},
    )
    return {"info": info, "rows": rows}


def _cell_rows(
    acc: dict[str, list[dict]], by_name: dict[str, Decoder], T: float, batch: int, pset: str, n_prompts: int
) -> list[dict]:
    def pooled(runs):
        return sum(r["generated_tokens"] for r in runs) / sum(r["time_s"] for r in runs)

    out = []
    tok = {e: (None if "unsupported" in runs[0] else pooled(runs)) for e, runs in acc.items()}
    ref = acc[HF][0].get("token_ids")
    for e, runs in acc.items():
        eng = by_name[e]
        row = {"decoder": e, "temperature": T, "batch": batch, "prompt_set": pset, "prompts": n_prompts}
        if eng.kind == "ours":
            row["batching"] = eng.batching
        if eng.scheduler_label is not None:
            row["scheduler"] = eng.scheduler_label
        if tok[e] is None:
            out.append({**row, "tok_s": None, "note": "unsupported: " + runs[0]["unsupported"]})
            continue
        row["tok_s"] = tok[e]
        row["runs_tok_s"] = [r["generated_tokens"] / r["time_s"] for r in runs]
        row["speedup_vs_hf"] = tok[e] / tok[HF]
        row["speedup_vs_plain"] = tok[e] / tok[eng.plain]
        taus = [r["tau"] for r in runs if r.get("tau") is not None]
        if taus:
            row["tau"] = sum(taus) / len(taus)
            row["efficiency"] = row["speedup_vs_plain"] / row["tau"]
            for k in ("acceptance_rate", "mean_verify_len", "survival", "conditional_acceptance"):
                row[k] = runs[0][k]
        if "time_split_s" in runs[0]:
            row["time_split_s"] = {k: sum(r["time_split_s"][k] for r in runs) for k in runs[0]["time_split_s"]}
            steps = sum(r["steps"] for r in runs)
            row["steps"], row["skipped_steps"] = steps, sum(r["skipped_steps"] for r in runs)
            if steps:  # per batched step: drafting (incl. the context-cache update) and verification
                row["ms_per_step"] = {k: 1e3 * row["time_split_s"][k] / steps for k in ("draft", "verify", "accept")}
                row["mean_step_tokens"] = sum(r["mean_step_tokens"] * r["steps"] for r in runs) / steps
        if T == 0 and batch == 1 and e != HF:
            row["equals_hf"] = all(r["token_ids"] == ref for r in runs)
        out.append(row)
    return out


def write_bench(doc: dict, out: str | Path) -> dict[str, Path]:
    from .report import bench_markdown, write_outputs

    return write_outputs(doc, out, {"bench.json": None, "bench.md": bench_markdown, "bench.png": plot_bench})


def plot_bench(doc: dict, path: Path) -> Path:
    from ..plots import panel_grid
    from .report import save_plot

    cells = list(dict.fromkeys((r["temperature"], r["batch"], r["prompt_set"]) for r in doc["rows"]))
    fig, axes = panel_grid(len(cells), panel=(3.2, 3.8))
    plain = {PLAIN, PLAIN_HF}
    for ax, (T, b, s) in zip(axes, cells, strict=True):
        rows = [r for r in doc["rows"] if (r["temperature"], r["batch"], r["prompt_set"]) == (T, b, s)]
        names = [r["decoder"] for r in rows]
        vals = [r["tok_s"] or 0.0 for r in rows]
        colors = ["0.6" if n in (HF, HF_PLD) else "0.3" if n.split(" [")[0] in plain else "C0" for n in names]
        ax.bar(range(len(rows)), vals, color=colors)
        ax.set_xticks(range(len(rows)), names, rotation=60, ha="right", fontsize=7)
        ax.set_title(f"T={T:g}, batch {b}, {s}", fontsize=9)
    cols = axes[0].get_subplotspec().get_gridspec().ncols
    for i, ax in enumerate(axes):
        if i % cols == 0:
            ax.set_ylabel("tokens / s")
    fig.suptitle(f"{doc['info']['target']}: throughput per decoder (grey: HF, dark: our plain, blue: drafters)")
    return save_plot(fig, path, dpi=110)
