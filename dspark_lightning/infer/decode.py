"""``decode()``: lossless speculative decoding of many prompts with a DSpark (or any) drafter.

from dspark_lightning import load_target, load_drafter
from dspark_lightning.infer import decode

target = load_target("smollm2-135m-instruct")
drafter = load_drafter("outputs/smollm2_dspark/tb/version_0/drafter", target, dtype="auto")  # or None: plain
# dtype="auto": the faster of fp32 and bf16 on this machine (what decode() picks for a drafter given by path)
result = decode(target, drafter, ["What is 17*23?"], max_new_tokens=256, temperature=0.0,
                scheduler="hardware_aware", seed=0)
result.texts, result.token_ids, result.stats.tau
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .. import checks
from ..checkpoint import check_chat_format, check_geometry, load_target_and_drafters, read_config
from ..checks import UsageError
from ..devices import resolve_device, resolve_dtype
from .acceptance.sampling import SamplingParams
from .build import make_engine
from .engine import Engine
from .hardware import HardwareProfile
from .profiling.measure_hardware import measure_hardware
from .schedule.schedulers import build_scheduler
from .stats import DecodeStats, RoundLog, summarize

Prompt = str | list[int] | list[dict[str, str]] | torch.Tensor


@dataclass
class DecodeResult:
    texts: list[str]  # decoded outputs (cut before a stop string; special tokens skipped)
    token_ids: list[list[int]]  # generated ids (a final stop token included)
    finish_reasons: list[str]  # "stop" | "stop_string" | "length"
    stats: DecodeStats
    requests: list[dict[str, Any]]  # per request: prompt/output tokens, rounds, tau, ttft_s, decode_s
    log: RoundLog | None = None  # per request-round records (ℓ, m, e, survival, raw confidence logits)


def encode_prompt(target, prompt: Prompt, chat: bool = True) -> list[int]:
    """A string or a list of turns (:meth:`Target.encode_prompt`'s rule), or token ids (checked) -> ids."""
    if isinstance(prompt, torch.Tensor):
        if prompt.dtype.is_floating_point or prompt.dtype.is_complex or prompt.dtype == torch.bool:
            raise UsageError(f"a token-id prompt tensor must hold integers, got dtype {prompt.dtype}")
        ids = [int(t) for t in prompt.reshape(-1)]
    elif isinstance(prompt, str):
        _check_text(prompt, "prompt")
        ids = target.encode_prompt(prompt, chat)
    elif isinstance(prompt, list | tuple) and prompt and isinstance(prompt[0], dict):
        for turn in prompt:
            if not isinstance(turn, dict) or not isinstance(turn.get("role"), str):
                raise UsageError(f"a chat turn must be a dict with a string 'role', got {turn!r:.80}")
            _check_text(turn.get("content"), f"the {turn['role']!r} turn's content")
        ids = target.encode_prompt(list(prompt), chat)
    elif isinstance(prompt, list | tuple):
        bad = [t for t in prompt if isinstance(t, bool) or not isinstance(t, int)]
        if bad:
            raise UsageError(f"token-id prompts must hold ints, got {bad[0]!r} ({type(bad[0]).__name__})")
        ids = [int(t) for t in prompt]
    else:
        raise TypeError(f"a prompt must be a string, a list of turns or token ids, got {type(prompt).__name__}")
    if not ids:
        raise UsageError("empty prompt")
    V = target.geometry.vocab_size
    bad = [t for t in ids if not 0 <= t < V]
    if bad:
        raise UsageError(f"prompt token ids {bad[:5]} are outside the target vocabulary [0, {V})")
    return ids


def _check_text(text, what: str) -> None:
    """Text the tokenizer can take: a string that is valid Unicode (no lone surrogates)."""
    if not isinstance(text, str):
        raise UsageError(f"{what} must be a string, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UsageError(f"{what} is not valid Unicode (a lone surrogate at character {exc.start})") from None


def resolve(target, drafter, device=None, dtype=None, drafter_dtype=None):
    """Load a target / drafter given by name or path on ``device`` in ``dtype`` (see :mod:`..devices`); check that
    objects passed in are where they were asked to be (moving a caller's model silently would surprise them)."""
    dev = resolve_device(device)
    if not isinstance(target, str | os.PathLike):
        if not (hasattr(target, "geometry") and hasattr(target, "model")):
            raise UsageError(f"target must be a loaded Target, an embedded name or an HF model directory, got "
                             f"{type(target).__name__}")  # fmt: skip
        if device is not None and dev.type != target.device.type:
            raise UsageError(f"the target is on {target.device}, decode() was asked for {device}: load it there")
    paths = [drafter] if isinstance(drafter, str | os.PathLike) else []
    target, loaded = load_target_and_drafters(target, paths, dtype=dtype, device=dev, drafter_dtype=drafter_dtype)
    if loaded:
        return target, loaded[0]
    if isinstance(drafter, torch.nn.Module):  # third-party proposer objects carry no parameters
        p = next(iter(drafter.parameters()), None)
        if p is not None and p.device != target.device:
            raise UsageError(
                f"the drafter is on {p.device} and the target on {target.device}: "
                "load_drafter(path, target) places it with the target"
            )
        check_drafter_object(drafter, target)
    return target, drafter


def check_drafter_object(drafter, target) -> None:
    """A drafter object must fit the target as a drafter loaded from a path must (geometry, chat format of the export
    it came from); a target tapping other layers than the drafter reads is re-tapped to them
    (:func:`~dspark_lightning.checkpoint.check_geometry`), before the engine, which reads the taps, is built."""
    g = getattr(drafter, "geometry", None)
    if g is None:
        return
    src = getattr(drafter, "source_dir", None)
    where = src or "the drafter object"
    check_geometry({k: getattr(g, k, None) for k in ("hidden_size", "vocab_size", "layer_ids")}, target, where)
    if src is not None and (Path(src) / "config.json").is_file():
        check_chat_format(read_config(Path(src)), target, where)


def decode(
    target,
    drafter=None,
    prompts: list[Prompt] | Prompt = (),
    *,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    scheduler: Any = "auto",
    seed: int = 0,
    seeds: list[int] | None = None,
    chat: bool = True,
    stop: list[str] | None = None,
    stop_token_ids: list[int] | None = None,
    batch_size: int | None = None,
    batching: str = "padded",
    calibrated: bool = True,
    verifier: Any = "auto",
    acceptance: Any = "rejection",
    hardware: HardwareProfile | None = None,
    on_commit=None,
    progress: bool = False,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    drafter_dtype: str | torch.dtype | None = "auto",
) -> DecodeResult:
    """Decode ``prompts`` with the target's exact sampling law, drafting with ``drafter`` (None = plain).

    Args:
        target: a :class:`~dspark_lightning.targets.Target`, an embedded name or an HF model directory.
        drafter: a drafter, an exported drafter directory, or None for plain decoding.
        prompts: strings, lists of chat turns, or token-id lists (one prompt may be passed bare).
        max_new_tokens: generated tokens per request (the last round may overshoot; outputs are trimmed).
        temperature, top_k, top_p: the sampling law, applied identically to draft and target (T=0: greedy).
        scheduler: ``auto`` (default: the hardware-aware scheduler this machine's measured SPS curve calls for,
            with the draft gate) | ``static`` | ``threshold`` | ``hardware_aware`` | ``async_hardware_aware``, a
            ``{"class_path": name, "init_args": {...}}`` spec, or a :class:`~.schedulers.Scheduler` (it keeps per-run
            state: use one object in one call at a time; names and specs build a fresh scheduler per call, safe
            across threads).
        seed: request i draws from its own drafting and acceptance streams, derived from (seed, i).
        seeds: one per prompt, pinning each request's streams (request i's from ``seeds[i]``), so
            ``decode([A], seeds=[7])`` and ``decode([B, A], seeds=[3, 7])`` give A the same tokens with the static
            and threshold schedulers (docs/inference.md, "Reproducibility").
        chat: apply the target's chat template to string prompts.
        stop: stop strings; the text is cut before them.
        stop_token_ids: tokens that end a request (default: the target's EOS / end-of-turn ids).
        batch_size: requests decoded together (default: all); more prompts join as others finish.
        batching: how requests share a forward of the target and the drafter: ``padded`` (a row each) or
            ``flat`` (one strip) (see :mod:`.kvcache`).
        calibrated: apply the drafter's STS confidence temperatures for this sampling temperature when it has
            them (``calibration_T<T>.json`` in its directory); False uses the raw confidence head.
        verifier: ``auto`` (the lean forward where it supports the target, else ``hf``) or a verifier named as
            every component is: ``"lean"``, ``"hf"``, a plugin's ``{"class_path": ..., "init_args": {...}}``.
        acceptance: ``rejection`` (speculative sampling, the default) or ``coupled``: drafter and target share
            Gumbel noise keyed by (seed, request, position), so at T > 0 the output is token for token that of
            plain decoding with ``acceptance="coupled"`` and the same seed, whatever the drafter, scheduler, batch
            or load (:mod:`.coupled`; it accepts somewhat less than rejection sampling); or a plugin's mode, by name or
            ``{"class_path": ..., "init_args": {...}}``.
        hardware: this machine's :class:`~.hardware.HardwareProfile` (SPS table, drafting cost, kernel table), whose
            parts the scheduler reads; a part it needs and the profile lacks is read from the cache or measured once
            before decoding (default: all of them).
        on_commit: ``fn(prompt_index, new_token_ids)`` after every round (streaming).
        progress: show a progress bar over finished requests.
        device, dtype: where and in which precision a target given by name runs (default ``auto``: CUDA in bf16
            when available, else the CPU in fp32); a drafter given by path follows the target's device, in
            ``drafter_dtype`` (default ``auto``: the faster of fp32 and bf16 there, measured once on a CPU; None:
            the target's dtype; a drafter object runs as it is). The sampling laws, the acceptance test and the
            residual are fp32 whatever these are, so a bf16 target's output law is the bf16 target's own.
    """
    t_setup = time.perf_counter()
    if isinstance(prompts, Iterator):  # a generator or iterator of prompts: read once, as a list
        prompts = list(prompts)
    check_decode_args(max_new_tokens, temperature, top_k, top_p, batch_size)
    _check_inputs(prompts, max_new_tokens, temperature, seed, seeds,
                         (("dtype", dtype), ("drafter_dtype", drafter_dtype)))  # fmt: skip
    scheduler = build_scheduler(scheduler)  # its spec checked before the target is loaded
    stop = check_stop(stop)
    target, drafter = resolve(target, drafter, device, dtype, drafter_dtype)
    check_stop_ids(stop_token_ids, target)
    if isinstance(prompts, torch.Tensor):  # (S,) one prompt, (N, S) N prompts
        prompts = [prompts] if prompts.dim() == 1 else list(prompts)
    single = isinstance(prompts, str) or (
        isinstance(prompts, list | tuple) and prompts and isinstance(prompts[0], int | dict)
    )
    prompt_list = [prompts] if single else list(prompts)
    if not prompt_list:
        raise UsageError("decode() needs at least one prompt")
    encoded = [encode_prompt(target, p, chat) for p in prompt_list]
    if seeds is not None and len(seeds) != len(encoded):
        raise UsageError(f"seeds has {len(seeds)} entries for {len(encoded)} prompts")
    engine = make_engine(target, drafter, SamplingParams(temperature, top_k, top_p), scheduler=scheduler, seed=seed,
                         stop_token_ids=stop_token_ids, stop=stop, batching=batching, calibrated=calibrated,
                         verifier=verifier, acceptance=acceptance, hardware=hardware)  # fmt: skip
    check_positions(target, encoded, max_new_tokens, engine.block_size)
    cap = batch_size or len(encoded)
    engine.use_hardware(measure_hardware(engine, target, drafter, cap))  # measured once and cached, outside the timing
    t_start = time.perf_counter()
    engine.time_s["setup"] = t_start - t_setup
    bar = _bar(len(encoded), progress)
    queued = 0
    while queued < len(encoded) or engine.active:
        room = cap - len(engine.active)
        if room > 0 and queued < len(encoded):
            batch = encoded[queued : queued + room]
            pinned = None if seeds is None else list(seeds[queued : queued + len(batch)])
            for r in engine.add(batch, max_new_tokens, first_index=queued, seeds=pinned):
                _emit(on_commit, r, r.output)
            queued += len(batch)
        for r, new in engine.step():
            _emit(on_commit, r, new)
        if bar is not None:
            bar.update(sum(r.done for r in engine.requests) - bar.n)
    if bar is not None:
        bar.close()
    return _result(engine, target, time.perf_counter() - t_start)


def check_decode_args(max_new_tokens, temperature, top_k, top_p, batch_size) -> None:
    """Refuse out-of-range sampling and batching arguments before anything is loaded or allocated (``batch_size``
    must be at least 1: None, not 0, means all the prompts at once)."""
    checks.at_least("max_new_tokens", max_new_tokens, 1)
    checks.at_least("batch_size", batch_size, 1)
    SamplingParams(temperature, top_k, top_p)  # the sampling law checks its own arguments


def check_stop(stop) -> list[str] | None:
    """``stop``: None, one string (one stop string, not its characters) or a list of non-empty strings."""
    if stop is None:
        return None
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list | tuple) or any(not isinstance(x, str) for x in stop):
        raise UsageError(f"stop must be a string or a list of strings, got {stop!r}")
    if any(not x for x in stop):
        raise UsageError("stop strings must not be empty (an empty stop string would cut every output to nothing)")
    return list(stop)


def check_stop_ids(stop_token_ids, target) -> None:
    if stop_token_ids is None:
        return
    if isinstance(stop_token_ids, int | str) or not isinstance(stop_token_ids, list | tuple | set):
        raise UsageError(f"stop_token_ids must be a list of token ids, got {stop_token_ids!r}")
    V = target.geometry.vocab_size
    for t in stop_token_ids:
        checks.token_id("stop_token_ids", t, V)


def check_positions(target, encoded: list[list[int]], max_new_tokens: int, block_size: int) -> None:
    limit = getattr(target.model.config, "max_position_embeddings", None)
    longest = max(len(p) for p in encoded) + max_new_tokens + block_size + 1
    if limit is not None and longest > limit:
        raise UsageError(f"prompt + max_new_tokens + block needs {longest} positions; the target supports {limit}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_inputs(prompts: Any, max_new_tokens: Any, temperature: Any, seed: Any, seeds: Any,
                  dtypes: tuple = ()) -> None:  # fmt: skip
    """What ``decode()`` takes beyond :func:`check_decode_args`, checked before anything is built:
    the required numbers are not None, seeds are ints, the prompts are a string, a tensor or a list (never bytes, a
    dict or a number, which iterate into something else), dtype names exist. A scheduler spec is checked where it is
    built (:func:`~.schedulers.build_scheduler`)."""
    if max_new_tokens is None or temperature is None:
        raise checks.UsageError(
            f"{'max_new_tokens' if max_new_tokens is None else 'temperature'} must be given, got None"
        )
    if not _is_int(seed):
        raise checks.UsageError(f"seed must be an int, got {seed!r}")
    if seeds is not None and (not isinstance(seeds, list | tuple) or not all(_is_int(s) for s in seeds)):
        raise checks.UsageError(f"seeds must be ints, in a list with one per prompt, got {checks.short(seeds)}")
    if not isinstance(prompts, str | list | tuple | torch.Tensor):
        raise checks.UsageError(f"prompts must be a string, a list of prompts or a tensor of token ids, got "
                         f"{type(prompts).__name__}")  # fmt: skip
    if isinstance(prompts, list | tuple) and prompts and not isinstance(prompts[0], int | dict):
        for i, p in enumerate(prompts):  # a list of prompts: each one a string, turns, token ids or a tensor
            if not isinstance(p, str | list | tuple | torch.Tensor) or isinstance(p, bool):
                raise checks.UsageError(
                    f"prompt {i} must be a string, a list of turns or token ids, got {type(p).__name__}"
                )
    for name, value in dtypes:
        if isinstance(value, str):
            try:
                resolve_dtype(value, "cpu")
            except ValueError as exc:
                raise checks.UsageError(f"{name}: {exc}") from None


def _emit(on_commit, r, new) -> None:
    if on_commit is not None and new:
        on_commit(r.index, list(new))


def _bar(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="decoding", unit="req")


def _result(engine: Engine, target, total_s: float) -> DecodeResult:
    reqs = sorted(engine.requests, key=lambda r: r.index)
    tok = target.tokenizer
    texts, per = [], []
    rounds = {}
    for idx, e in zip(engine.log.request, engine.log.committed, strict=True):
        n, s = rounds.get(idx, (0, 0))
        rounds[idx] = (n + 1, s + e)
    for r in reqs:
        texts.append(_text(tok, r.output, engine.stop_strings))
        n, s = rounds.get(r.index, (0, 0))
        per.append(
            {
                "prompt_tokens": len(r.prompt),
                "output_tokens": len(r.output),
                "rounds": n,
                "tau": s / n if n else None,
                "ttft_s": r.t_first - r.t_added,
                "decode_s": r.t_done - r.t_first,
                "finish_reason": r.finish_reason,
            }
        )
    generated = sum(len(r.output) for r in reqs)
    engine.settle_timings()
    time_s = {**engine.time_s, "total": total_s}
    stats = summarize(engine.log, engine.block_size, generated, len(reqs), time_s)
    check_profile(getattr(engine.scheduler, "sps", None), engine.log.step_tokens, time_s["verify"])
    outputs, reasons = [list(r.output) for r in reqs], [r.finish_reason for r in reqs]
    return DecodeResult(texts, outputs, reasons, stats, per, engine.log)


_SAID_STALE: set[str] = set()


def check_profile(sps, step_tokens: list[int], verify_s: float, factor: float = 1.6, min_steps: int = 32) -> None:
    """Warn (once per table) when this call's verification steps ran ``factor`` times faster than the SPS table
    says: a table measured while the machine was busy, which makes every hardware-aware choice too timid. Slower
    steps are not warned about (this machine may be busy now)."""
    if sps is None or len(step_tokens) < min_steps or verify_s <= 0:
        return
    fits = [b for b in step_tokens if b <= sps.max_tokens]
    if len(fits) < min_steps:
        return
    modelled = float((1.0 / sps(torch.tensor(fits, dtype=torch.float64))).sum()) * len(step_tokens) / len(fits)
    key = str(sps.meta.get("date", id(sps)))
    if verify_s * factor < modelled and key not in _SAID_STALE:
        import warnings

        _SAID_STALE.add(key)
        warnings.warn(
            f"this call verified {modelled / verify_s:.1f}x faster than the SPS table measured on "
            f"{sps.meta.get('date', '?')} says (a table taken while the machine was busy?): the hardware-aware "
            "schedulers then verify too little; delete $DSPARK_CACHE/sps (default ~/.cache/dspark_lightning/sps) to "
            "measure it again, alone on the machine",
            stacklevel=3,
        )


def _text(tokenizer, ids: list[int], stop_strings: list[str]) -> str:
    if tokenizer is None:
        return ""
    text = tokenizer.decode(ids, skip_special_tokens=True)
    for s in stop_strings:
        if s in text:
            text = text[: text.index(s)]
    return text
