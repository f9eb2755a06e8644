"""A vLLM engine behind a pipe: the program the pinned vLLM venv runs for us (``vllm.py`` starts it).

It imports only the standard library and vLLM (our package is not installed in that venv: vLLM 0.32 pins
``transformers<5.20``, we need more). One JSON document per line:

- stdin, first line: the engine's settings, ``{"model": DIR, "dtype": "float32", "max_model_len": N, "seed": S,
  "speculative_config": {...} | null, "engine": {other vllm.LLM keyword arguments}}``; answered ``{"ready": true,
  "architecture": ..., "speculative": {...} | null}``.
- then requests: ``{"op": "generate", "prompts": [[token ids], ...], "params": [{"max_tokens", "temperature",
  "top_p", "top_k", "seed", "stop_token_ids"}, ...]}`` -> ``{"outputs": [{"ids": [...], "finish_reason": ...}],
  "seconds": wall time of the call}``; ``{"op": "exit"}``; the ops a wrapper script adds (:func:`main`).
- an error is answered ``{"error": "Type: message"}`` and the worker goes on (a failed start exits after it).

vLLM prints its logs on stdout: the answers go to the stdout the worker was started with, and everything vLLM
writes goes to stderr.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any


def _answer(out, doc: dict) -> None:
    out.write(json.dumps(doc) + "\n")
    out.flush()


def _engine(cfg: dict):
    from vllm import LLM

    kw = dict(cfg.get("engine") or {})
    kw.setdefault("enforce_eager", True)
    kw.setdefault("disable_log_stats", False)  # the speculative-decoding counters are stats (a wrapper's ops read them)
    spec = cfg.get("speculative_config")
    if spec:
        kw["speculative_config"] = spec
    return LLM(model=cfg["model"], dtype=cfg.get("dtype", "float32"), max_model_len=int(cfg.get("max_model_len", 2048)),
               seed=int(cfg.get("seed", 0)), **kw)  # fmt: skip


def _generate(llm, req: dict) -> dict:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in req["prompts"]]
    params = []
    for p in req["params"]:
        kw = {"max_tokens": int(p["max_tokens"]), "temperature": float(p.get("temperature", 0.0)),
              "top_p": float(p.get("top_p", 1.0)), "ignore_eos": bool(p.get("ignore_eos", False)),
              "stop_token_ids": [int(t) for t in p.get("stop_token_ids") or []], "detokenize": False}  # fmt: skip
        if p.get("top_k") is not None:
            kw["top_k"] = int(p["top_k"])
        if p.get("seed") is not None:
            kw["seed"] = int(p["seed"])
        params.append(SamplingParams(**kw))
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - t0
    rows = [{"ids": list(o.outputs[0].token_ids), "finish_reason": o.outputs[0].finish_reason} for o in outs]
    return {"outputs": rows, "seconds": seconds}


def main(extra_ops: dict[str, Callable[[Any, dict], dict]] | None = None) -> None:
    """Serve the pipe; ``extra_ops``: more ops, name -> ``f(llm, request) -> answer``, that a wrapper script adds (the
    tests' ``tests/slow/vllm_mrv2.py``: vLLM's speculative-decoding counters, what it built from a draft's config)."""
    here = os.path.dirname(os.path.abspath(__file__))  # holds our vllm.py, which must not shadow the vllm package
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    out = os.fdopen(os.dup(1), "w")  # the answers' pipe; vLLM's own prints go to stderr from here on
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    first = sys.stdin.readline()
    try:
        cfg = json.loads(first)
        llm = _engine(cfg)
        arch = llm.llm_engine.model_config.architectures
        sc = llm.llm_engine.vllm_config.speculative_config
        spec = None if sc is None else {"method": sc.method, "num_speculative_tokens": sc.num_speculative_tokens}
        _answer(out, {"ready": True, "architecture": list(arch or []), "speculative": spec})
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it in one line
        traceback.print_exc()
        _answer(out, {"error": f"{type(exc).__name__}: {exc}"})
        return
    ops = {"generate": lambda r: _generate(llm, r)}
    ops.update({name: functools.partial(f, llm) for name, f in (extra_ops or {}).items()})
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            if req.get("op") == "exit":
                break
            _answer(out, ops[req["op"]](req))
        except Exception as exc:  # noqa: BLE001 - the parent decides; the engine stays up
            traceback.print_exc()
            _answer(out, {"error": f"{type(exc).__name__}: {exc}"})


if __name__ == "__main__":
    main()
