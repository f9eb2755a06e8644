"""``dspark-lightning decode`` and ``dspark-lightning profile`` (no Lightning import).

dspark-lightning decode --target smollm2-135m-instruct --drafter outputs/.../drafter --prompt "What is 17*23?"
dspark-lightning decode --target tiny-debug --prompts prompts.jsonl --json_out results.json
dspark-lightning profile --target smollm2-135m-instruct --out sps.json --plot sps.png
"""

from __future__ import annotations

import json
import sys
from typing import Any, Literal

from .. import checks, devices
from ..atomic import atomic_write
from ..checkpoint import load_target_and_drafters
from ..checks import UsageError
from ..infer.acceptance.sampling import GREEDY_EPS
from ..targets import load_target_checked

Batching = Literal["padded", "flat"]


def several(value: Any) -> list:
    """A flag that takes one value or a list of them (``--domains code``, ``--domains [math,code]``) as a list."""
    return list(value) if isinstance(value, list | tuple) else [value]


def check_choice(name: str, value: str, choices) -> None:
    if value not in choices:
        raise checks.UsageError(f"{name} {value!r} is not one of {', '.join(choices)}")


def scheduler_arg(text: str | dict, sps: str | None = None, flag: str = "--scheduler") -> Any:
    """A command's scheduler value as its spec (:func:`~dspark_lightning.infer.schedule.schedulers.scheduler_spec`),
    the ``--sps`` file checked first: both before any model is loaded."""
    from ..infer.schedule.schedulers import scheduler_spec

    if sps:
        check_sps_file(sps)
    try:
        return scheduler_spec(text, sps)
    except checks.UsageError as exc:
        raise checks.UsageError(f"{flag} {exc}") from None


def check_sps_file(path: str) -> None:
    """An SPS table JSON (``dspark-lightning profile --out``) with matching, non-empty ``tokens`` and ``sps``."""
    doc = checks.read_json(checks.input_file("--sps", path), "SPS table")
    tokens, sps = (doc.get("tokens"), doc.get("sps")) if isinstance(doc, dict) else (None, None)
    if not isinstance(tokens, list) or not isinstance(sps, list) or not tokens or len(tokens) != len(sps):
        raise checks.UsageError(f"SPS table {path} needs non-empty 'tokens' and 'sps' lists of one length")


def component_arg(flag: str, kind: str, value: str, *special: str) -> Any:
    """``value``, a registered ``kind`` (built-in or a plugin's) as a name or YAML ``{class_path, init_args}``, as its
    spec; an unknown name or argument is one line naming ``flag``. ``special``: names the command resolves itself
    (the verifier's ``auto``)."""
    from ..registry import Component, resolve

    if value in special:
        return value
    try:
        resolve(kind, value)
    except checks.UsageError as exc:
        raise checks.UsageError(f"{flag}: {exc}") from None
    return Component(value).spec


def read_prompts(path: str, limit: int | None) -> list[str]:
    """The first turn of each record of a ``{"turns": [...]}`` JSONL file (the first ``limit``); an unreadable file
    or one without prompts is an error naming it."""
    from ..data.prompts.sources import JsonlPrompts

    checks.input_file("--prompts", path)
    try:
        prompts = [rec.turns[0] for rec in JsonlPrompts(path=path).records()]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, IndexError) as exc:
        raise checks.UsageError(f"--prompts {path} is not a JSONL file of {{'turns': [...]}} records ({exc})") from None
    if not prompts:
        raise checks.UsageError(f"--prompts {path} holds no prompts")
    return prompts[:limit] if limit is not None else prompts


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


def decode(
    target: str = "smollm2-135m-instruct",
    drafter: str | None = None,
    prompt: str | None = None,
    prompts: str | None = None,
    limit: int | None = None,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    scheduler: str | dict = "auto",
    sps: str | None = None,
    seed: int = 0,
    batch_size: int | None = None,
    batching: Batching = "padded",
    verifier: str = "auto",
    acceptance: str = "rejection",
    no_chat: bool = False,
    stop: str | list[str] = (),
    json_out: str | None = None,
    device: str = "auto",
    dtype: str = "auto",
    drafter_dtype: str = "auto",
) -> None:
    """Lossless speculative decoding with a drafter.

    Args:
        target: embedded name or HF model directory
        drafter: exported drafter directory (none: plain)
        prompt: a prompt (several: --prompts)
        prompts: JSONL file, one {"turns": [...]} per line
        limit: use the first N prompts of --prompts
        max_new_tokens: most tokens generated per prompt
        temperature: 0 = greedy
        top_k: sample among the k most likely tokens only (default: all)
        top_p: sample within the smallest set of tokens of probability p (default: all)
        scheduler: a registered scheduler's name or {class_path: NAME, init_args: {...}}: auto (the hardware-aware
            scheduler this machine's SPS curve calls for) | static | threshold | hardware_aware | async_hardware_aware
        sps: SPS table JSON for the schedulers that take one (default: this machine's cached profile)
        batch_size: concurrent requests (default: all)
        batching: padded (a row per request) | flat (one strip, no padding compute)
        verifier: auto (lean where supported) | lean | hf | a plugin's, by name or {class_path: NAME, init_args: {...}}
        acceptance: rejection | coupled (T > 0: plain coupled decoding's tokens, any drafter) | a plugin's, by name
            or {class_path: NAME, init_args: {...}}
        no_chat: do not apply the chat template
        stop: stop string(s): "###" or ["###", "\n\n"]
        json_out: write texts, token ids and stats here
    """
    from ..infer.decode import check_decode_args
    from ..infer.decode import decode as speculative_decode

    check_decode_args(max_new_tokens, temperature, top_k, top_p, batch_size)  # all checked before a model loads
    checks.at_least("--limit", limit, 0)
    spec = scheduler_arg(scheduler, sps)
    verifier = component_arg("--verifier", "verifier", verifier, "auto")
    acceptance = component_arg("--acceptance", "acceptance", acceptance)
    devices.check_device_args(device, dtype, drafter_dtype)
    stop = several(stop)
    if any(not s for s in stop):
        raise checks.UsageError("--stop must not be empty (an empty stop string would cut every output to nothing)")
    checks.output_file("--json_out", json_out)
    if drafter is not None:
        checks.drafter_config(drafter)
    texts = ([prompt] if prompt is not None else []) + (read_prompts(prompts, limit) if prompts else [])
    if not texts:
        raise UsageError("give --prompt TEXT or --prompts FILE.jsonl")
    tgt, models = load_target_and_drafters(target, [drafter] if drafter else [], dtype=dtype, device=device,
                                           drafter_dtype=drafter_dtype)  # fmt: skip
    model = models[0] if models else None
    stream = len(texts) == 1
    res = speculative_decode(tgt, model, texts, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                             top_p=top_p, scheduler=spec, seed=seed, chat=not no_chat, stop=list(stop) or None,
                             batch_size=batch_size, batching=batching, verifier=verifier, acceptance=acceptance,
                             on_commit=_Streamer(tgt.tokenizer) if stream else None,
                             progress=not stream)  # fmt: skip
    mode = "greedy" if temperature < GREEDY_EPS else f"T={temperature}"
    from ..eval.runner import scheduler_label

    who = f"drafter {drafter}, scheduler {scheduler_label(spec)}" if model is not None else "plain decoding"
    _report(res, stream, f"{who}, {mode}", json_out)


def _report(res, streamed: bool, what: str, json_out: str | None) -> None:
    """The texts (unless streamed), the statistics line, and the JSON file ``--json_out`` asks for."""
    if streamed:
        print()
    else:
        for i, text in enumerate(res.texts):
            print(f"--- [{i}] {res.finish_reasons[i]} ---\n{text}")
    print(f"[dspark-lightning] {what}: {res.stats.summary()}", file=sys.stderr)
    if json_out:
        out = {"texts": res.texts, "token_ids": res.token_ids, "finish_reasons": res.finish_reasons}
        out |= {"stats": res.stats.to_dict(), "requests": res.requests}
        atomic_write(json_out, json.dumps(out, indent=2) + "\n")  # the previous file survives a full disk


def profile(
    target: str = "smollm2-135m-instruct",
    out: str | None = None,
    plot: str | None = None,
    max_tokens: int | None = None,
    context_len: int = 512,
    repeats: int = 5,
    verifier: str = "auto",
    device: str = "auto",
    dtype: str = "auto",
) -> None:
    """Measure the target's SPS(B) on this machine (benchmarks/profile_breakdown.py times each part of a
    verification or drafting round).

    Args:
        target: embedded name or HF model directory
        out: table JSON (default: the per-device cache)
        plot: also write a PNG of the curve
        max_tokens: largest B profiled (default 256)
        context_len: cached context tokens during the timed forward
        repeats: timed forwards per B (the median is kept)
        verifier: the verifier timed: auto | lean | hf
    """
    from ..infer.profiling.busy import too_busy
    from ..infer.profiling.measure_sps import default_path, profile_sps

    checks.at_least("--max_tokens", max_tokens, 1)
    checks.at_least("--context_len", context_len, 1)
    checks.at_least("--repeats", repeats, 1)
    verifier = component_arg("--verifier", "verifier", verifier, "auto")
    devices.check_device_args(device, dtype, "auto")
    checks.output_file("--out", out)
    checks.output_file("--plot", plot)
    tgt = load_target_checked(target, dtype=dtype, device=device)
    checks.fits_positions(tgt, context_len + (max_tokens or 256), "--context_len + --max_tokens")
    table = profile_sps(tgt, max_tokens=max_tokens, context_len=context_len, repeats=repeats, verifier=verifier)
    roof = roofline_of(table, tgt, context_len)
    if out or not too_busy(table.meta, "the SPS table"):  # a table asked for by name is written all the same
        print(f"[dspark-lightning] SPS table -> {table.save(out or default_path(tgt, context_len))}")
    for b, raw, s in zip(table.tokens, table.raw_sps, table.sps, strict=True):
        print(f"  B={b:4d}  {1000 / raw:8.2f} ms  SPS {raw:8.2f} (smoothed {s:8.2f})")
    print(roof)
    if plot:
        from ..plots import plot_sps

        print(f"[dspark-lightning] plot -> {plot_sps(table, plot)}")


def roofline_of(table, target, context_len: int) -> str:
    """The measured steps against the memory-bound floor (:mod:`dspark_lightning.infer.profiling.roofline`), for the B a
    decoding step reaches."""
    from ..infer.profiling import roofline as rf

    dev = next(target.model.parameters()).device
    nbytes, machine = rf.step_bytes(target), rf.Machine.measure(dev, next(target.model.parameters()).dtype)
    times = {b: 1.0 / raw for b, raw in zip(table.tokens, table.raw_sps, strict=True) if b <= 16 or b in (32, 64)}
    table.meta["roofline"] = {
        "bandwidth_gb_s": round(machine.bandwidth / 1e9, 2),
        "gflop_s": round(machine.flops / 1e9, 1),
        "weight_mb": round(nbytes.weights / 1e6, 1),
    }
    return rf.roofline_text(rf.roofline_rows(times, nbytes, machine, context_len), nbytes, machine, context_len)
