"""``dspark-lightning decode`` and ``dspark-lightning profile`` (no Lightning import).

dspark-lightning decode --target smollm2-135m-instruct --drafter outputs/.../drafter --prompt "What is 17*23?"
dspark-lightning decode --target tiny-debug --prompts prompts.jsonl --json_out results.json
dspark-lightning profile --target smollm2-135m-instruct --out sps.json --plot sps.png
dspark-lightning profile --breakdown verify --out docs/data/verify_profile      (per-part cost of a round)
dspark-lightning profile --breakdown draft --drafter outputs/.../drafter --out docs/data/draft_profile
"""

from __future__ import annotations

import json
import sys

from jsonargparse import ArgumentParser

from .. import checks
from ..atomic import atomic_write
from ..checkpoint import load_drafter_checked
from ..targets import load_target_checked
from .acceptance.sampling import GREEDY_EPS

LAYOUTS = ("padded", "flat")


def add_device_args(p: ArgumentParser) -> None:
    """``--device`` / ``--dtype`` / ``--drafter_dtype`` for every command that runs the target."""
    p.add_argument("--device", type=str, default="auto", help="auto (CUDA when available) | cpu | cuda | cuda:N")
    p.add_argument("--dtype", type=str, default="auto", help="target: auto (bf16 on CUDA, fp32 on CPU) | bf16 | fp32")
    p.add_argument(
        "--drafter_dtype", type=str, default="auto", help="drafter: auto (the faster of fp32/bf16 here) | bf16 | fp32"
    )


def check_device_args(a) -> None:
    """``--device`` / ``--dtype`` / ``--drafter_dtype`` name things that exist, before the target is loaded."""
    from ..devices import resolve_device, resolve_dtype

    dev = resolve_device(a.device)
    resolve_dtype(a.dtype, dev)
    if a.drafter_dtype is not None:
        resolve_dtype(a.drafter_dtype, dev)


def check_choice(name: str, value: str, choices) -> None:
    if value not in choices:
        raise checks.UsageError(f"{name} {value!r} is not one of {', '.join(choices)}")


def check_scheduler_args(a) -> None:
    """The scheduler name, its knobs and the SPS table file: all cheap to check before any model is loaded."""
    from ..registry import names

    check_choice("--scheduler", a.scheduler, names("scheduler"))
    if getattr(a, "gamma", None) is not None:
        checks.at_least("--gamma", a.gamma, 1)
    if hasattr(a, "threshold"):
        checks.probability("--threshold", a.threshold)
    if getattr(a, "sps", None):
        check_sps_file(a.sps)


def check_sps_file(path: str) -> None:
    """An SPS table JSON (``dspark-lightning profile --out``) with matching, non-empty ``tokens`` and ``sps``."""
    doc = checks.read_json(checks.input_file("--sps", path), "SPS table")
    tokens, sps = (doc.get("tokens"), doc.get("sps")) if isinstance(doc, dict) else (None, None)
    if not isinstance(tokens, list) or not isinstance(sps, list) or not tokens or len(tokens) != len(sps):
        raise checks.UsageError(f"SPS table {path} needs non-empty 'tokens' and 'sps' lists of one length")


def check_verifier(value: str) -> None:
    from ..registry import names

    check_choice("--verifier", value, ["auto", *names("verifier")])


def decode_parser() -> ArgumentParser:
    p = ArgumentParser(prog="dspark-lightning decode", description="Lossless speculative decoding with a drafter.",
                       exit_on_error=False)  # fmt: skip
    p.add_argument("--target", type=str, default="smollm2-135m-instruct", help="embedded name or HF model directory")
    p.add_argument("--drafter", type=str | None, default=None, help="exported drafter directory (none: plain)")
    p.add_argument("--prompt", type=str, action="append", default=[], help="a prompt (repeatable)")
    p.add_argument("--prompts", type=str | None, default=None, help='JSONL file, one {"turns": [...]} per line')
    p.add_argument("--limit", type=int | None, default=None, help="use the first N prompts of --prompts")
    p.add_argument("--max_new_tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top_k", type=int | None, default=None)
    p.add_argument("--top_p", type=float | None, default=None)
    p.add_argument(
        "--scheduler",
        type=str,
        default="auto",
        help="auto (the hardware-aware scheduler this machine's SPS curve calls for) | static | threshold | "
        "hardware_aware | async_hardware_aware",
    )
    p.add_argument("--gamma", type=int | None, default=None, help="static: drafts verified per round")
    p.add_argument("--threshold", type=float, default=0.5, help="threshold: survival threshold")
    p.add_argument("--sps", type=str | None, default=None, help="SPS table JSON (default: cached profile)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch_size", type=int | None, default=None, help="concurrent requests (default: all)")
    p.add_argument("--layout", type=str, default="padded", help="padded | flat")
    p.add_argument("--verifier", type=str, default="auto", help="auto (lean where supported) | lean | hf")
    p.add_argument("--acceptance", type=str, default="rejection",
                   help="rejection | coupled (T > 0: plain coupled decoding's tokens, any drafter)")  # fmt: skip
    p.add_argument("--no_chat", type=bool, default=False, help="do not apply the chat template")
    p.add_argument("--stop", type=str, action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--json_out", type=str | None, default=None, help="write texts, token ids and stats here")
    add_device_args(p)
    return p


def profile_parser() -> ArgumentParser:
    p = ArgumentParser(prog="dspark-lightning profile", description="Measure the target's SPS(B) on this machine, or "
                       "(--breakdown verify|draft) the cost of each part of a verification or drafting round.",
                       exit_on_error=False)  # fmt: skip
    p.add_argument("--target", type=str, default="smollm2-135m-instruct")
    p.add_argument("--out", type=str | None, default=None,
                   help="table JSON (default: the per-device cache); with --breakdown: a directory")  # fmt: skip
    p.add_argument("--plot", type=str | None, default=None, help="also write a PNG of the curve")
    p.add_argument("--max_tokens", type=int | None, default=None, help="largest B profiled (default 256)")
    p.add_argument("--context_len", type=int, default=512, help="cached context tokens during the timed forward")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--verifier", type=str, default="auto", help="the verifier timed: auto | lean | hf")
    p.add_argument("--breakdown", type=str | None, default=None,
                   help="verify: one verification step per verifier and B, and its ops; draft: one drafting "
                   "round per component and drafter variant; writes <out>/{verify,draft}_profile.*")  # fmt: skip
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="--breakdown verify: the B timed")
    p.add_argument("--rounds", type=int | None, default=None,
                   help="--breakdown: interleaved timed rounds (default: 9 verify, 15 draft)")  # fmt: skip
    p.add_argument("--drafter", type=str | None, default=None,
                   help="--breakdown draft: a trained drafter, timed in fp32 and bf16 next to random ones")  # fmt: skip
    p.add_argument("--layers", type=int, default=2, help="--breakdown draft: layers of the random DSpark drafters")
    add_device_args(p)
    return p


def scheduler_spec(a) -> dict:
    if a.scheduler == "static":
        return {"name": "static", "gamma": a.gamma}
    if a.scheduler == "threshold":
        return {"name": "threshold", "threshold": a.threshold}
    return {"name": a.scheduler, "sps": a.sps} if a.sps else {"name": a.scheduler}


def read_prompts(path: str, limit: int | None) -> list[str]:
    """The first turn of each record of a ``{"turns": [...]}`` JSONL file (the first ``limit``); an unreadable file
    or one without prompts is an error naming it."""
    from ..data.sources import JsonlPrompts

    checks.input_file("--prompts", path)
    try:
        prompts = [rec.turns[0] for rec in JsonlPrompts(path=path).records()]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, IndexError) as exc:
        raise checks.UsageError(f"--prompts {path} is not a JSONL file of {{'turns': [...]}} records ({exc})") from None
    if not prompts:
        raise checks.UsageError(f"--prompts {path} holds no prompts")
    return prompts[:limit] if limit is not None else prompts


def check_decode_cli(a) -> None:
    """Everything ``decode`` can check before loading a model: ranges, choices and the files it reads and writes."""
    from .decode import check_decode_args

    check_decode_args(a.max_new_tokens, a.temperature, a.top_k, a.top_p, a.batch_size)
    checks.at_least("--limit", a.limit, 0)
    check_scheduler_args(a)
    check_choice("--layout", a.layout, LAYOUTS)
    check_verifier(a.verifier)
    check_choice("--acceptance", a.acceptance, ["rejection", "coupled"])
    check_device_args(a)
    if any(not s for s in a.stop):
        raise checks.UsageError("--stop must not be empty (an empty stop string would cut every output to nothing)")
    checks.output_file("--json_out", a.json_out)
    if a.drafter is not None:
        checks.drafter_config(a.drafter)


class _Streamer:
    """Prints one request's text as it is committed (decoding the whole output each time keeps UTF-8 whole)."""

    def __init__(self, tokenizer) -> None:
        self.tok, self.ids, self.shown = tokenizer, [], 0

    def __call__(self, _index: int, new: list[int]) -> None:
        self.ids.extend(new)
        text = self.tok.decode(self.ids, skip_special_tokens=True)
        if not text.endswith("\ufffd"):
            sys.stdout.write(text[self.shown :])
            sys.stdout.flush()
            self.shown = len(text)


def run_decode(argv: list[str]) -> None:
    from .decode import decode

    a = decode_parser().parse_args(argv)
    check_decode_cli(a)
    prompts = list(a.prompt) + (read_prompts(a.prompts, a.limit) if a.prompts else [])
    if not prompts:
        raise ValueError("give --prompt TEXT or --prompts FILE.jsonl")
    from ..checkpoint import recorded_target_args

    recorded = recorded_target_args(a.drafter) if a.drafter else {}  # the layers and chat format it was trained with
    target = load_target_checked(a.target, dtype=a.dtype, device=a.device, **recorded)
    drafter = load_drafter_checked(a.drafter, target, a.drafter_dtype) if a.drafter else None
    stream = len(prompts) == 1
    res = decode(
        target,
        drafter,
        prompts,
        max_new_tokens=a.max_new_tokens,
        temperature=a.temperature,
        top_k=a.top_k,
        top_p=a.top_p,
        scheduler=scheduler_spec(a),
        seed=a.seed,
        chat=not a.no_chat,
        stop=a.stop or None,
        batch_size=a.batch_size,
        layout=a.layout,
        verifier=a.verifier,
        acceptance=a.acceptance,
        on_commit=_Streamer(target.tokenizer) if stream else None,
        progress=not stream,
    )
    if stream:
        print()
    else:
        for i, text in enumerate(res.texts):
            print(f"--- [{i}] {res.finish_reasons[i]} ---\n{text}")
    mode = "greedy" if a.temperature < GREEDY_EPS else f"T={a.temperature}"
    who = f"drafter {a.drafter}, scheduler {a.scheduler}" if drafter is not None else "plain decoding"
    print(f"[dspark-lightning] {who}, {mode}: {res.stats.summary()}", file=sys.stderr)
    if a.json_out:
        out = {"texts": res.texts, "token_ids": res.token_ids, "finish_reasons": res.finish_reasons}
        out |= {"stats": res.stats.to_dict(), "requests": res.requests}
        atomic_write(a.json_out, json.dumps(out, indent=2) + "\n")  # the previous file survives a full disk


def run_profile(argv: list[str]) -> None:
    from .schedule.sps import default_path, profile_sps

    a = profile_parser().parse_args(argv)
    if a.breakdown is not None:
        return run_breakdown(a)
    checks.at_least("--max_tokens", a.max_tokens, 1)
    checks.at_least("--context_len", a.context_len, 1)
    checks.at_least("--repeats", a.repeats, 1)
    check_verifier(a.verifier)
    check_device_args(a)
    checks.output_file("--out", a.out)
    checks.output_file("--plot", a.plot)
    target = load_target_checked(a.target, dtype=a.dtype, device=a.device)
    checks.fits_positions(target, a.context_len + (a.max_tokens or 256), "--context_len + --max_tokens")
    table = profile_sps(
        target, max_tokens=a.max_tokens, context_len=a.context_len, repeats=a.repeats, verifier=a.verifier
    )
    roof = roofline_of(table, target, a.context_len)
    path = table.save(a.out or default_path(target, a.context_len))
    print(f"[dspark-lightning] SPS table -> {path}")
    for b, raw, s in zip(table.tokens, table.raw_sps, table.sps, strict=True):
        print(f"  B={b:4d}  {1000 / raw:8.2f} ms  SPS {raw:8.2f} (smoothed {s:8.2f})")
    print(roof)
    if a.plot:
        from ..plots import plot_sps

        print(f"[dspark-lightning] plot -> {plot_sps(table, a.plot)}")


def roofline_of(table, target, context_len: int) -> str:
    """The measured steps against the memory-bound floor (:mod:`dspark_lightning.profiling.roofline`), for the B a
    decoding step reaches."""
    from ..profiling import roofline as rf

    dev = next(target.model.parameters()).device
    nbytes, machine = rf.step_bytes(target), rf.Machine.measure(dev, next(target.model.parameters()).dtype)
    times = {b: 1.0 / raw for b, raw in zip(table.tokens, table.raw_sps, strict=True) if b <= 16 or b in (32, 64)}
    table.meta["roofline"] = {
        "bandwidth_gb_s": round(machine.bandwidth / 1e9, 2),
        "gflop_s": round(machine.flops / 1e9, 1),
        "weight_mb": round(nbytes.weights / 1e6, 1),
    }
    return rf.roofline_text(rf.roofline_rows(times, nbytes, machine, context_len), nbytes, machine, context_len)


def check_breakdown_args(a) -> None:
    """``--breakdown``'s options, before any model is loaded."""
    check_choice("--breakdown", a.breakdown, ("verify", "draft"))
    if a.out is None:
        raise checks.UsageError("--breakdown writes <out>/{verify,draft}_profile.{json,md}: give --out DIR")
    if a.plot is not None:
        raise checks.UsageError("--plot draws the SPS curve; --breakdown writes tables only")
    if a.drafter is not None and a.breakdown != "draft":
        raise checks.UsageError("--drafter is timed by --breakdown draft")
    checks.at_least("--context_len", a.context_len, 1)
    checks.at_least("--rounds", a.rounds, 1)
    checks.at_least("--layers", a.layers, 1)
    for b in a.tokens:
        checks.at_least("--tokens", b, 1)
    check_device_args(a)
    checks.output_dir("--out", a.out)
    if a.drafter is not None:
        checks.drafter_config(a.drafter)


def run_breakdown(a) -> None:
    """``profile --breakdown verify|draft``: the tables of :mod:`dspark_lightning.profiling.breakdown` into
    ``--out``."""
    from pathlib import Path

    from ..profiling import breakdown as bd

    check_breakdown_args(a)
    from ..checkpoint import recorded_target_args

    recorded = recorded_target_args(a.drafter) if a.drafter is not None else {}  # the layers it was trained on
    target = load_target_checked(a.target, dtype=a.dtype, device=a.device, **recorded)
    if a.breakdown == "verify":
        checks.fits_positions(target, a.context_len + max(a.tokens), "--context_len + --tokens")
        doc = bd.verify_breakdown(target, context=a.context_len, tokens=tuple(a.tokens), rounds=a.rounds or 9)
        md = bd.verify_markdown(doc)
    else:
        checks.fits_positions(target, a.context_len + 8, "--context_len + a round")
        trained = {}
        if a.drafter is not None:
            trained["trained"] = load_drafter_checked(a.drafter, target, "fp32")
            trained["trained bf16"] = load_drafter_checked(a.drafter, target, "bf16")
        drafters = bd.draft_variants(target, trained, layers=a.layers)
        doc = bd.draft_breakdown(target, drafters, context=a.context_len, rounds=a.rounds or 15)
        doc["info"]["drafter"] = a.drafter
        md = bd.draft_markdown(doc)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    json_name, md_name = bd.OUTPUT_FILES[a.breakdown]
    atomic_write(out / json_name, json.dumps(doc, indent=2) + "\n")
    atomic_write(out / md_name, md + "\n")
    print(md)
    print(f"[dspark-lightning] profile --breakdown -> {out / json_name}, {out / md_name}", file=sys.stderr)
