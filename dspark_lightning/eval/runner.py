"""``dspark-lightning eval``: τ per drafter x dataset (the paper's Table 1), position-wise acceptance
(its Figure 2), and tokens/s against plain decoding of the same target in the same run.

    dspark-lightning eval --drafter dspark=outputs/compare/dspark/tb/version_0/drafter \
        --drafter dflash=outputs/compare/dflash/tb/version_0/drafter --out outputs/eval

Datasets: the built-in held-out sets (``gsm_symbolic`` math, ``humaneval`` code, ``mtbench`` chat; see
:mod:`.prompts`) and any ``{"turns": [...]}`` JSONL (``--dataset name=path.jsonl:domain``). The first
user turn is the prompt (the paper's protocol). Every drafter and plain decoding see the same prompts,
chat template, sampling, output cap, batch size and seed. Files written into ``--out``: see
:data:`OUTPUT_FILES`.
"""

from __future__ import annotations

import json
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from ..atomic import atomic_write
from ..checks import UsageError
from .prompts import EVAL_SETS, eval_prompts

BUILTIN = {"gsm_symbolic": "math", "humaneval": "code", "mtbench": "chat"}  # dataset -> domain
OUTPUT_FILES = {
    "tau_table.json": "τ per drafter x dataset, per-domain and macro means, tok/s, speedups, run info",
    "tau_table.md": "the same as Markdown tables",
    "acceptance.json": "per drafter x dataset: conditional acceptance A_k, survival S_k, rounds",
    "acceptance.png": "A_k against block position k, one panel per dataset, one line per drafter",
}


@dataclass
class Dataset:
    name: str
    domain: str
    prompts: list[str]  # first user turns


def builtin_datasets(domains: list[str], n: int) -> list[Dataset]:
    by_domain = {v: k for k, v in BUILTIN.items()}
    out = []
    for dom in domains:
        if dom not in EVAL_SETS:
            raise UsageError(f"unknown domain {dom!r}; built-in domains are {', '.join(EVAL_SETS)}")
        out.append(Dataset(by_domain[dom], dom, [r.turns[0] for r in eval_prompts(dom, n)]))
    return out


def jsonl_dataset(spec: str, n: int) -> Dataset:
    """``name=path.jsonl`` or ``name=path.jsonl:domain`` (default: the records' own domain)."""
    from ..data.prompts.sources import JsonlPrompts

    if "=" not in spec:
        raise UsageError(f"--dataset wants name=path.jsonl[:domain], got {spec!r}")
    name, rest = spec.split("=", 1)
    path, _, domain = rest.partition(":") if not Path(rest).is_file() else (rest, "", "")
    try:
        recs = list(JsonlPrompts(path=path).records())[:n]
    except ValueError as exc:
        raise UsageError(f"dataset {name!r}: {exc}") from exc
    if not recs:
        raise UsageError(f"dataset {name!r}: {path} has no prompts")  # never skip an empty set silently
    return Dataset(name, domain or recs[0].domain, [r.turns[0] for r in recs])


def responses_datasets(path: str | Path, n: int) -> list[Dataset]:
    """Sets from a responses JSONL (a recipe's ``<work_dir>/responses_heldout.jsonl``): the first user turns of the
    first ``n`` records of each source, in file order. A source's prompt forms are apart
    (``python_stdlib/complete``, ``algorithms/instruct``), and a source whose records span domains gives one set per
    domain (``sharegpt_v3:code``)."""
    from ..data.prompts.sources import DOMAINS, _turn_texts

    recs: list[tuple[str, str, str]] = []  # (base name, domain, first user turn)
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                if not isinstance(rec, dict):
                    raise UsageError("expected a JSON object")
                rid, source = str(rec.get("id", "")), rec.get("source") or rec.get("domain") or Path(path).stem
                first = _turn_texts(rec.get("turns"))[0]
            except ValueError as exc:  # json.JSONDecodeError is a ValueError
                raise UsageError(f"{path}:{lineno}: not a responses record: {exc}") from None
            parts = rid.split("/")
            base = "/".join(parts[:2]) if len(parts) > 2 and parts[1] in ("complete", "instruct") else str(source)
            dom = str(rec.get("domain") or "chat")
            if dom not in DOMAINS:  # the macro average is over these: another would enter it as a set
                raise UsageError(f"{path}:{lineno}: domain {dom!r} is not one of {', '.join(DOMAINS)} (the domains the "
                                 "metrics average over); fix the record's domain")  # fmt: skip
            recs.append((base, dom, first))
    if not recs:
        raise UsageError(f"{path} holds no records")
    domains: dict[str, set[str]] = {}
    for base, dom, _ in recs:
        domains.setdefault(base, set()).add(dom)
    sets: dict[str, Dataset] = {}
    for base, dom, first in recs:
        name = f"{base}:{dom}" if len(domains[base]) > 1 else base
        ds = sets.setdefault(name, Dataset(name, dom, []))
        if len(ds.prompts) < n:
            ds.prompts.append(first)
    return list(sets.values())


def scheduler_label(spec: Any) -> str:
    """A scheduler spec as the reports name it: ``static``, ``static:3`` (one argument: its value),
    ``threshold:threshold=0.6,mode=raw`` (several), ``hardware_aware``; a spec given as YAML text is read first."""
    if isinstance(spec, str) and spec.strip().startswith("{"):
        import yaml

        try:
            spec = yaml.safe_load(spec)
        except yaml.YAMLError:
            return spec
    if isinstance(spec, dict):
        name = str(spec.get("class_path", "?")).rpartition(".")[2]
        init = {k: v for k, v in (spec.get("init_args") or {}).items() if k != "sps"}
        if len(init) == 1:
            return f"{name}:{next(iter(init.values()))}"
        return f"{name}:{','.join(f'{k}={v}' for k, v in init.items())}" if init else name
    return str(spec)


def run_decode(
    target, drafter, prompts, *, temperature, batch_size, scheduler, max_new_tokens, seed, verifier="auto",
    acceptance="rejection", batching="padded",
) -> dict:  # fmt: skip
    """One ``decode()`` run; the numbers every report reads (``batching``: padded or flat, how the requests of a
    forward share it)."""
    from ..infer import decode

    res = decode(
        target,
        drafter,
        prompts,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        scheduler=scheduler,
        seed=seed,
        batch_size=batch_size,
        verifier=verifier,
        acceptance=acceptance,
        batching=batching,
    )
    s = res.stats
    return {
        "token_ids": res.token_ids,
        "generated_tokens": s.generated_tokens,
        "time_s": s.time_s["total"],
        "tok_s": s.tokens_per_s,
        "rounds": s.rounds,
        "tau": s.tau if drafter is not None else None,
        "acceptance_rate": s.acceptance_rate,
        "verify_rate": s.verify_rate,
        "mean_verify_len": s.mean_verify_len,
        "mean_step_tokens": s.mean_step_tokens,
        "steps": s.steps,
        "skipped_steps": s.skipped_steps,
        "survival": s.survival,
        "conditional_acceptance": s.conditional_acceptance,
        "time_split_s": s.time_s,
    }


def warmup(target, drafters: dict[str, Any], scheduler: Any = "static") -> None:
    """One short decode, plain and per drafter, before anything is timed (first-call allocations, lazy init)."""
    prompt = [target.encode_prompt("Hello")]
    for d in [None, *drafters.values()]:
        run_decode(target, d, prompt, temperature=1.0, batch_size=1, scheduler=scheduler if d else "static",
                   max_new_tokens=4, seed=0)  # fmt: skip


def drafter_dtype_name(drafter: Any) -> str | None:
    """The precision a drafter object runs in (``bf16``/``fp32``), None for parameter-free proposers."""
    from ..devices import dtype_name, param_dtype

    dt = param_dtype(drafter)
    return None if dt is None else dtype_name(dt)


def run_info(target, **extra: Any) -> dict:
    import subprocess

    import transformers

    from ..devices import device_tag

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
    return {
        "target": target.name,
        "threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(),
        "cpu": device_tag(torch.device("cpu")),  # CPU model and thread count: compare ratios within one run only
        "commit": commit.stdout.strip() or None,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        **extra,
    }


def evaluate(
    target,
    drafters: dict[str, Any],
    datasets: list[Dataset],
    *,
    temperature: float = 1.0,
    max_new_tokens: int = 256,
    batch_size: int = 8,
    scheduler: Any = "static",
    seed: int = 980406,
    progress: bool = True,
) -> dict:
    """Decode every dataset plainly and with each drafter; returns the tau_table.json document."""
    from tqdm.auto import tqdm

    prompts = {d.name: [target.encode_prompt(p) for p in d.prompts] for d in datasets}
    runs: dict[str, dict[str, dict]] = {"plain": {}, **{name: {} for name in drafters}}
    jobs = [(ds, name) for ds in datasets for name in runs]
    kw = {"temperature": temperature, "batch_size": batch_size, "max_new_tokens": max_new_tokens, "seed": seed}
    warmup(target, drafters, scheduler)
    bar = tqdm(jobs, desc="eval", unit="run", disable=not progress)
    for ds, name in bar:
        bar.set_postfix_str(f"{ds.name} / {name}")
        d = None if name == "plain" else drafters[name]
        runs[name][ds.name] = run_decode(target, d, prompts[ds.name], scheduler=scheduler, **kw)
    return tables(target, drafters, datasets, runs, dict(kw, scheduler=scheduler_label(scheduler)))


def tables(target, drafters, datasets, runs, settings) -> dict:
    names = list(drafters)
    tau = {n: {d.name: runs[n][d.name]["tau"] for d in datasets} for n in names}
    domains = list(dict.fromkeys(d.domain for d in datasets))

    def mean(xs):
        return sum(xs) / len(xs)

    domain_tau = {
        n: {dom: mean([tau[n][d.name] for d in datasets if d.domain == dom]) for dom in domains} for n in names
    }
    tok_s = {n: {d.name: runs[n][d.name]["tok_s"] for d in datasets} for n in runs}
    doc = {
        "info": run_info(target, **settings),
        "datasets": [{**asdict(d), "prompts": len(d.prompts)} for d in datasets],
        "drafters": {n: getattr(drafters[n], "source_dir", None) for n in names},
        "drafter_dtypes": {n: drafter_dtype_name(drafters[n]) for n in names},
        "tau": tau,
        "domain_tau": domain_tau,
        "macro_tau": {n: mean(list(tau[n].values())) for n in names},  # unweighted over datasets (docs/algorithm.md §2)
        "acceptance_rate": {n: {d.name: runs[n][d.name]["acceptance_rate"] for d in datasets} for n in names},
        "rounds": {n: {d.name: runs[n][d.name]["rounds"] for d in datasets} for n in names},
        "tokens_per_s": tok_s,
        "speedup_vs_plain": {n: {d.name: tok_s[n][d.name] / tok_s["plain"][d.name] for d in datasets} for n in names},
        "time_split_s": {n: {d.name: runs[n][d.name]["time_split_s"] for d in datasets} for n in runs},
    }
    doc["acceptance"] = {
        n: {
            d.name: {
                "domain": d.domain,
                "conditional_acceptance": runs[n][d.name]["conditional_acceptance"],
                "survival": runs[n][d.name]["survival"],
                "rounds": runs[n][d.name]["rounds"],
            }
            for d in datasets
        }
        for n in names
    }
    return doc


def write_eval(doc: dict, out: str | Path) -> dict[str, Path]:
    """Write every file of :data:`OUTPUT_FILES` into ``out``."""
    from .report import eval_markdown, plot_acceptance

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    acceptance = doc.pop("acceptance")
    paths = {
        "tau_table.json": out / "tau_table.json",
        "tau_table.md": out / "tau_table.md",
        "acceptance.json": out / "acceptance.json",
        "acceptance.png": out / "acceptance.png",
    }
    atomic_write(paths["tau_table.json"], json.dumps(doc, indent=1) + "\n")  # each file all or nothing
    atomic_write(paths["acceptance.json"], json.dumps(acceptance, indent=1) + "\n")
    atomic_write(paths["tau_table.md"], eval_markdown(doc) + "\n")
    plot_acceptance(acceptance, paths["acceptance.png"], title=_title(doc["info"]))
    doc["acceptance"] = acceptance
    return paths


def _title(info: dict) -> str:
    return f"{info['target']}, T = {info['temperature']:g}, {info['scheduler']} scheduler"
