"""Response regeneration by the target (docs/algorithm.md §4), as DSpark/EAGLE training data is made.

Every user turn is answered in order from the regenerated history, rendered with the target's
shared :class:`~dspark_lightning.targets.ChatFormat` (pitfall 5). Output is JSONL, one row per
conversation, appended and fsynced per batch and keyed by id, so a resume skips finished ids and
never duplicates a row (pitfall 19). An append that fails (a full disk) is cut back to the rows
before it; a resume drops a torn last line and deduplicates ids an old race wrote twice. Row schema::

    {"id": str, "domain": str, "source": str,
     "turns": [{"role": "user", "content": ...}, {"role": "assistant", "content": ...}, ...],
     "gen": {<settings>, "new_tokens": [int per assistant turn], "stopped": [bool per assistant turn]},
     "meta": {...}}  # only when the prompt record has meta

Three backends, all seeding each (conversation, turn) from (seed, id, turn), so a row's response does
not depend on which other rows share its batch and a resume reproduces the same text (up to float
effects of batching):

- ``dspark`` (default): our own decoding engine (:class:`~dspark_lightning.infer.Engine`, plain
  decoding with the lean verifier) with **continuous batching over conversations**: up to
  ``concurrency`` turns decode together, and when one finishes the next waiting turn (a new
  conversation, or the same conversation's next user turn) joins at once. Sampling is the runtime's
  law (temperature, top-k, top-p as HF's warpers) from a per-request stream.
- ``hf``: HF ``generate`` on left-padded batches of ``batch_size`` conversations, a turn at a time,
  with temperature, top-k and top-p filtering then a per-row Gumbel-max draw.
- ``openai``: an OpenAI-compatible chat server, ``concurrency`` conversations in flight (regen_server.py).
- ``vllm``: vLLM's offline engine on the target's directory, in the pinned vLLM venv, a turn of the whole batch at
  a time (regen_vllm.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from ... import checks
from ...atomic import append_durable, atomic_write, atomic_writer
from ..prompts.sources import PromptRecord

log = logging.getLogger(__name__)
_ROLES = ("user", "assistant", "system")
BACKENDS = ("dspark", "hf", "openai", "vllm")


class _PerRowSampler:
    """A logits processor: filter like HF's warpers, then add per-row Gumbel noise (argmax = a sample)."""

    def __init__(self, seeds: list[int], temperature: float, top_p: float, top_k: int | None) -> None:
        self.seeds, self.temperature, self.top_p, self.top_k = seeds, temperature, top_p, top_k
        self.gens: list[torch.Generator] | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores = scores.float() / self.temperature
        if self.top_k is not None and self.top_k < scores.shape[-1]:
            kth = torch.topk(scores, self.top_k, dim=-1).values[:, -1:]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if self.top_p < 1.0:
            sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
            probs = sorted_scores.softmax(dim=-1)
            drop_sorted = probs.cumsum(dim=-1) - probs >= self.top_p  # the top token is always kept
            scores = scores.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))
        if self.gens is None:
            self.gens = [torch.Generator(device=scores.device).manual_seed(s) for s in self.seeds]
        exp = torch.stack(
            [torch.empty(scores.shape[-1], device=scores.device).exponential_(generator=g) for g in self.gens]
        )
        return scores - exp.log()  # argmax(logits + Gumbel) ~ softmax(logits)


def _row_seed(seed: int, record_id: str, turn: int) -> int:
    digest = hashlib.sha256(f"regen:{seed}:{record_id}:{turn}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & (2**63 - 1)


def _sample(
    target: Any, prompts: list[list[int]], seeds: list[int], cfg: dict[str, Any], budgets: list[int] | None = None
) -> list[tuple[str, int, bool]]:
    """Left-padded batched ``generate``; returns (response text, generated tokens, stopped) per prompt. ``budgets``:
    new tokens each row may keep (what fits the target's positions); the batch runs to the largest and each row is
    cut at its own (a row's earlier tokens never depend on later positions)."""
    budgets = budgets or [cfg["max_new_tokens"]] * len(prompts)
    from transformers import GenerationConfig, LogitsProcessorList

    tok, stop = target.tokenizer, set(target.stop_token_ids)
    pad = tok.pad_token_id if tok.pad_token_id is not None else target.eos_token_id
    device = next(target.model.parameters()).device
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    # Greedy over our perturbed scores; neutralise processors a checkpoint's generation_config.json could add.
    gc = GenerationConfig(
        max_new_tokens=max(budgets),
        do_sample=False,
        num_beams=1,
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        eos_token_id=sorted(stop),
        pad_token_id=pad,
    )
    procs = LogitsProcessorList()
    if cfg["temperature"] > 0:
        procs.append(_PerRowSampler(seeds, cfg["temperature"], cfg["top_p"], cfg["top_k"]))
    out = target.model.generate(input_ids=ids, attention_mask=mask, generation_config=gc, logits_processor=procs)
    return [_split_output(target, row[:n]) for row, n in zip(out[:, width:].tolist(), budgets, strict=True)]


class _Conversations:
    """Bookkeeping of a batch of conversations being regenerated turn by turn (shared by the backends)."""

    def __init__(self, recs: list[PromptRecord], cfg: dict[str, Any], positions: int | None = None) -> None:
        limit = cfg["max_turns"]
        self.recs, self.cfg, self.positions = recs, cfg, positions
        self.clamped = self.too_long = 0  # turns cut to the target's positions, conversations that did not fit
        self.turns = [r.turns if limit is None else r.turns[:limit] for r in recs]
        self.history: list[list[dict[str, str]]] = [_system_turn(r) for r in recs]
        self.n_tok: list[list[int]] = [[] for _ in recs]
        self.stopped: list[list[bool]] = [[] for _ in recs]
        self.alive, self.tokens = set(range(len(recs))), 0
        self.prompt_tokens = 0  # rendered prompt tokens of the turns asked (the prefill work)

    def ask(self, target: Any, i: int, t: int) -> tuple[list[int], int]:
        """Append user turn t of conversation i; returns its rendered prompt ids and its sampling seed."""
        self.history[i].append({"role": "user", "content": self.turns[i][t]})
        prompt = target.encode_prompt(self.history[i])
        self.prompt_tokens += len(prompt)
        return prompt, _row_seed(self.cfg["seed"], self.recs[i].id, t)

    def budget(self, i: int, prompt: list[int]) -> int:
        """New tokens this turn may take: ``max_new_tokens``, cut to the target's positions after the prompt; a
        prompt that fills them drops its conversation (0)."""
        room = self.cfg["max_new_tokens"] if self.positions is None else self.positions - len(prompt)
        if room < 1:
            self.too_long += 1
            self.alive.discard(i)
            return 0
        self.clamped += room < self.cfg["max_new_tokens"]
        return min(room, self.cfg["max_new_tokens"])

    def answer(self, i: int, text: str, n: int, stop: bool) -> bool:
        """Record the response to conversation i's last user turn; an empty one drops the conversation."""
        self.tokens += n
        if not text:
            self.alive.discard(i)
            return False
        self.history[i].append({"role": "assistant", "content": text})
        self.n_tok[i].append(n)
        self.stopped[i].append(stop)
        return True

    def result(self) -> tuple[list[dict], int, int]:
        """(rows of the surviving conversations in input order, generated tokens, conversations dropped)."""
        rows = []
        for i in sorted(self.alive):
            r = self.recs[i]
            row = {
                "id": r.id,
                "domain": r.domain,
                "source": r.source,
                "turns": self.history[i],
                "gen": {**self.cfg, "new_tokens": self.n_tok[i], "stopped": self.stopped[i]},
            }
            if r.meta:
                row["meta"] = r.meta
            rows.append(row)
        if self.clamped or self.too_long:
            log.warning("regenerate: %d turns cut to the target's %d positions, %d conversations dropped (the prompt "
                        "fills them)", self.clamped, self.positions, self.too_long)  # fmt: skip
        return rows, self.tokens, len(self.recs) - len(self.alive)


def _system_turn(rec: PromptRecord) -> list[dict[str, str]]:
    """A conversation's own system message (kept in its row, rendered by the chat template), if it has one."""
    return [{"role": "system", "content": rec.system}] if rec.system else []


def _fixed_row(target: Any, rec: PromptRecord, cfg: dict[str, Any]) -> dict:
    """The row of a record with fixed responses: its user turns answered by its own text (up to ``max_turns``);
    ``gen.fixed`` marks it, ``new_tokens`` counts the response tokens (the target's tokenizer)."""
    n = len(rec.responses) if cfg["max_turns"] is None else min(cfg["max_turns"], len(rec.responses))
    turns: list[dict[str, str]] = _system_turn(rec)
    replies = [r.strip() for r in rec.responses[:n]]  # as a regenerated answer is kept (and BPE merges no edge)
    for user, reply in zip(rec.turns[:n], replies, strict=True):
        turns += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
    counts = [len(target.tokenizer(r, add_special_tokens=False)["input_ids"]) for r in replies]
    row = {
        "id": rec.id,
        "domain": rec.domain,
        "source": rec.source,
        "turns": turns,
        "gen": {**cfg, "fixed": True, "new_tokens": counts, "stopped": [True] * n},
    }
    if rec.meta:
        row["meta"] = rec.meta
    return row


def _split_output(target: Any, out: list[int]) -> tuple[str, int, bool]:
    """Generated ids -> (text before the first stop token, tokens generated, stopped)."""
    stop = set(target.stop_token_ids)
    cut = next((j for j, t in enumerate(out) if t in stop), None)
    body = out if cut is None else out[:cut]
    stopped = cut is not None
    return target.tokenizer.decode(body, skip_special_tokens=True).strip(), len(body) + stopped, stopped


class EngineRegenerator:
    """Continuous batching over conversations with our decoding engine (see the module docstring)."""

    def __init__(self, target: Any, cfg: dict[str, Any], concurrency: int, capture: bool = False) -> None:
        from ...infer.generation import FeatureTrace, generation_engine  # data/'s one seam into the runtime

        self.target, self.cfg, self.concurrency = target, cfg, concurrency
        self.trace = FeatureTrace() if capture else None
        self.engine = generation_engine(target, cfg["temperature"], cfg["top_k"], cfg["top_p"], trace=self.trace)
        self.captured: dict[str, dict[str, Any]] = {}  # record id -> its last turn's features (capture only)
        self.on_finished: Any = None  # called with 1 as each conversation ends (a progress bar's update)
        self.prompt_tokens = 0  # prompt tokens prefilled so far (with the generated ones: the target's work)

    def answer(self, recs: list[PromptRecord]) -> tuple[list[dict], int, int]:
        """Regenerate every turn of ``recs``; returns (rows in input order, generated tokens, rows dropped)."""
        from collections import deque

        eng, conv = self.engine, _Conversations(recs, self.cfg, checks.positions_of(self.target))
        # shortest prompts first: requests decoding together then have similar lengths, and a step's attention
        # (every row padded to the longest) wastes less; rows come back in input order and each has its own seed
        order = sorted(range(len(recs)), key=lambda i: len(recs[i].system or "") + len(recs[i].turns[0]))
        waiting = deque((i, 0) for i in order)
        running: dict[int, tuple[int, int]] = {}  # request id -> (conversation, turn)
        while waiting or running:
            while waiting and len(running) < self.concurrency:
                i, t = waiting.popleft()
                prompt, seed = conv.ask(self.target, i, t)
                budget = conv.budget(i, prompt)
                if not budget:
                    self._finished()
                    continue
                req = eng.add([prompt], budget, seeds=[seed])[0]
                running[req.rid] = (i, t)
            if any(not r.done for r in eng.requests):
                eng.step()
            for r in [r for r in eng.requests if r.done and r.rid in running]:
                i, t = running.pop(r.rid)
                kept = conv.answer(i, *_split_output(self.target, r.output))
                if kept and t + 1 < len(conv.turns[i]):
                    waiting.appendleft((i, t + 1))  # the conversation's next turn goes first
                else:
                    self._finished()
                if self.trace is not None:
                    self._capture(recs[i].id, r, last=kept and t + 1 >= len(conv.turns[i]))
            eng.requests = [r for r in eng.requests if not r.done]  # finished requests leave the engine
        self.prompt_tokens += conv.prompt_tokens
        return conv.result()

    def _finished(self) -> None:
        if self.on_finished is not None:
            self.on_finished(1)

    def _capture(self, rid: str, r: Any, last: bool) -> None:
        """Keep the features of a conversation's last turn: its whole rendered history was prefilled and every
        response token but the final one (never fed back) was run, so positions 0..n-1 of ``tokens`` have them."""
        context, hidden = self.trace.pop(r.rid)
        if not last:
            return
        tokens = [*r.prompt, *r.output]
        n = len(tokens) - 1
        if context.shape[0] < n:  # cannot happen with a complete trace; the row then takes the feature pass
            return
        # FeatureTrace.pop concatenated fresh tensors: a slice of them owns nothing else worth a copy
        self.captured[rid] = {"tokens": tokens, "prompt_len": len(r.prompt), "context": context[:n],
                              "hidden": hidden[:n]}  # fmt: skip

    def take_captured(self, ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The captured features of ``ids`` (those that have them), forgotten here."""
        return {i: self.captured.pop(i) for i in ids if i in self.captured}


def _answer_batch(
    target: Any, recs: list[PromptRecord], cfg: dict[str, Any], sample: Any = None
) -> tuple[list[dict], int, int]:
    """Regenerate every turn of a batch, that turn of every conversation at once with ``sample(prompts, seeds,
    budgets)`` (HF ``generate`` by default); returns (rows, generated tokens, rows dropped for an empty response)."""
    sample = sample or (lambda prompts, seeds, budgets: _sample(target, prompts, seeds, cfg, budgets))
    conv = _Conversations(recs, cfg, checks.positions_of(target))
    for t in range(max(len(x) for x in conv.turns)):
        idx = [i for i in sorted(conv.alive) if t < len(conv.turns[i])]
        asked = {i: conv.ask(target, i, t) for i in idx}
        budgets = {i: conv.budget(i, asked[i][0]) for i in idx}
        idx = [i for i in idx if budgets[i]]
        if not idx:
            break
        outs = sample([asked[i][0] for i in idx], [asked[i][1] for i in idx], [budgets[i] for i in idx])
        for i, out in zip(idx, outs, strict=True):
            conv.answer(i, *out)
    return conv.result()


class _Scan:
    """A JSONL file of rows as :func:`_scan_rows` reads it."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, dict]] = []  # (line number, row) of every valid line
        self.truncated_at: int | None = None  # byte offset of an unparseable last line (a torn write)
        self.unterminated_at: int | None = None  # byte offset of a valid last line without its newline
        self.size = 0


def _scan_rows(path: Path) -> _Scan:
    """Parse a JSONL file of rows.

    A malformed line followed by more rows raises ``ValueError("<file>:<line>: ...")``; an unparseable *last* line
    (a crash or a full disk mid-write, or the zeros a file system leaves after a power loss) is reported as
    truncated, a parseable last line without its newline as unterminated.
    """
    scan, pending = _Scan(), None
    offset = 0
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            start, offset = offset, offset + len(line)
            if not line.strip():
                continue
            if pending is not None:  # a bad line with rows after it: not a torn write
                raise ValueError(f"{path}:{pending[1]}: malformed row: {pending[2]}")
            try:
                row = json.loads(line)
                if not isinstance(row, dict) or not isinstance(row.get("id"), str):
                    raise ValueError('expected a JSON object with a string "id"')
            except ValueError as exc:
                pending = (start, lineno, exc)
                continue
            scan.rows.append((lineno, row))
            if not line.endswith(b"\n"):
                scan.unterminated_at = start
    scan.size = offset
    if pending is not None:
        scan.truncated_at = pending[0]
    return scan


def _warn(msg: str) -> None:
    warnings.warn(msg, stacklevel=3)
    log.warning(msg)


def _prepare_resume(path: Path, cfg: dict[str, Any]) -> set[str]:
    """Ids already in ``path``, after repairing what an interrupted or concurrent writer left: a torn last line (not
    valid JSON: cut short, or the zeros of a power loss) is cut off, and rows whose id is already on an earlier line
    are dropped (the first complete line wins), each with a one-line warning; then checks the settings match.

    A last line that parses but lost only its newline is a whole row (a JSON object closes only at its end): it
    gets its newline back rather than being paid for again."""
    if not path.exists() or path.stat().st_size == 0:
        return set()
    scan = _scan_rows(path)
    rows = scan.rows
    if scan.truncated_at is not None:
        _warn(
            f"{path}: dropping a truncated last line at byte {scan.truncated_at} (not valid JSON: an interrupted "
            "write) before resuming"
        )
        with open(path, "r+b") as f:
            f.truncate(scan.truncated_at)
            f.flush()
            os.fsync(f.fileno())
    if scan.unterminated_at is not None:  # only ever the file's last line
        append_durable(path, b"\n")  # a complete last row without its newline
    first: dict[str, int] = {}
    dups = [(lineno, row["id"]) for lineno, row in rows if first.setdefault(row["id"], lineno) != lineno]
    if dups:
        lineno, rid = dups[0]
        _warn(
            f"{path}: {len(dups)} rows repeat an id of an earlier line (e.g. id {rid!r} on line {lineno}, first on "
            f"line {first[rid]}; two writers at once?): keeping the first of each"
        )
        keep = {lineno for lineno, row in rows if first[row["id"]] == lineno}
        with open(path, "rb") as src, atomic_writer(path) as dst:
            for n, line in enumerate(src, 1):
                if n in keep:
                    dst.write(line)
        rows = [(n, row) for n, row in rows if n in keep]
    for lineno, row in rows:
        old = {k: row.get("gen", {}).get(k) for k in cfg}
        if old != cfg:
            diff = {k: (old[k], cfg[k]) for k in cfg if old[k] != cfg[k]}
            raise ValueError(
                f"{path}:{lineno}: row was generated with different settings {diff} (old, new); "
                "resume with the same settings or write to a new file"
            )
    return {row["id"] for _, row in rows}


def generation_settings(
    target: Any,
    *,
    temperature: float = 0.2,
    top_p: float = 0.9,
    top_k: int | None = None,
    max_new_tokens: int = 256,
    seed: int = 42,
    max_turns: int | None = None,
    backend: str = "dspark",
    server: Any = None,
    extra_settings: dict[str, Any] | None = None,
    **_: Any,  # batch_size, concurrency, progress: how the rows are made, not what they are
) -> dict[str, Any]:
    """What a response row depends on, recorded in its ``gen`` and compared on resume."""
    return {
        "temperature": float(temperature),
        "top_p": float(top_p),
        "top_k": top_k,
        "max_new_tokens": max_new_tokens,
        "seed": seed,
        "max_turns": max_turns,
        "backend": backend,
        **({"server": {"base_url": server.base_url, "model": server.model}} if server is not None else {}),
        "target": target.name,
        "chat": target.chat.to_dict(),
        **(extra_settings or {}),
    }


def same_settings(row: dict[str, Any], cfg: dict[str, Any]) -> bool:
    gen = row.get("gen", {})
    return all(gen.get(k) == v for k, v in cfg.items())


def regenerate(
    target: Any,
    prompts: Iterable[PromptRecord],
    out_path: str | os.PathLike,
    *,
    batch_size: int = 8,
    max_new_tokens: int = 256,
    temperature: float = 0.2,
    top_p: float = 0.9,
    top_k: int | None = None,
    seed: int = 42,
    max_turns: int | None = None,
    backend: str = "dspark",
    concurrency: int = 32,
    progress: bool = True,
    extra_settings: dict[str, Any] | None = None,
    server: Any = None,
    capture_dir: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Answer every user turn of ``prompts`` with ``target`` and append rows to ``out_path`` (resumable).

    ``backend``: ``dspark`` (our decoding Engine, continuous batching of up to ``concurrency`` turns; rows are written
    every ``max(batch_size, 4 * concurrency)`` conversations), ``hf`` (``generate`` on batches of ``batch_size``) or
    ``openai`` (an OpenAI-compatible server, ``server``: a
    :class:`~dspark_lightning.data.regen.regen_server.ServerConfig`; ``concurrency`` conversations in flight).
    ``temperature=0`` is greedy. Rows with an empty response at any turn are dropped. ``extra_settings`` are recorded
    in every row's ``gen`` and checked on resume like the sampling settings (prepare records ``regen_dtype`` there).
    ``capture_dir`` (backend ``dspark``): the target features of each conversation's last turn, as the decoding
    computed them, are saved there (:func:`save_captured`, one file per batch, written before the batch's rows) so
    that the feature stage needs no second forward for them (:mod:`.features`' ``captured_sample``).
    Returns stats:
    ``written``, ``skipped`` (already in the file), ``dropped_empty``, ``tokens``, ``setup_s`` (starting the backend),
    ``seconds`` and ``tokens_per_s`` (answering).
    """
    prompts = list(prompts)
    if not prompts:
        raise ValueError("regenerate: no prompts given")
    ids = [r.id for r in prompts]
    if len(set(ids)) != len(ids):
        seen: set[str] = set()
        dup = sorted({i for i in ids if i in seen or seen.add(i)})
        raise ValueError(f"regenerate: duplicate prompt ids {dup[:5]} (rows are keyed by id)")
    if backend not in BACKENDS:
        raise ValueError(f"regenerate: backend must be one of {BACKENDS}, got {backend!r}")
    if capture_dir is not None and backend != "dspark":
        raise ValueError(f"regenerate: capturing features needs backend 'dspark' (our engine), not {backend!r}")
    if (backend == "openai") != (server is not None):
        raise ValueError("regenerate: backend 'openai' needs a server (base_url and model), and only it takes one")
    for name, value in (("batch_size", batch_size), ("concurrency", concurrency), ("max_new_tokens", max_new_tokens)):
        checks.at_least(f"regenerate: {name}", "None" if value is None else value, 1)
    checks.at_least("regenerate: top_k", top_k, 1)
    checks.at_least("regenerate: max_turns", max_turns, 1)
    checks.temperature("regenerate: temperature", "None" if temperature is None else temperature)
    checks.in_range("regenerate: top_p", "None" if top_p is None else top_p, 0.0, 1.0, open_low=True)
    limit = checks.positions_of(target)
    if limit is not None and max_new_tokens >= limit:
        raise checks.UsageError(f"regenerate: max_new_tokens={max_new_tokens} leaves no room for a prompt in the "
                                f"{limit} positions of the target {target.name!r}; use less than {limit}")  # fmt: skip
    cfg = generation_settings(target, temperature=temperature, top_p=top_p, top_k=top_k,
                              max_new_tokens=max_new_tokens, seed=seed, max_turns=max_turns, backend=backend,
                              server=server, extra_settings=extra_settings)  # fmt: skip
    path = Path(out_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    done = _prepare_resume(path, cfg)
    todo = [r for r in prompts if r.id not in done]
    stats = {"written": 0, "skipped": len(prompts) - len(todo), "dropped_empty": 0, "tokens": 0}
    fixed = [r for r in todo if r.responses]
    if fixed:  # fixed text: written as it is (the target scores it at feature extraction), no decoding
        rows = [_fixed_row(target, r, cfg) for r in fixed]
        append_durable(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
        stats["written"] += len(rows)
        stats["fixed"] = len(rows)
        stats["fixed_tokens"] = sum(sum(row["gen"]["new_tokens"]) for row in rows)
        todo = [r for r in todo if not r.responses]

    from tqdm.auto import tqdm

    setup = time.perf_counter()
    bar = tqdm(total=len(prompts), initial=stats["skipped"], unit="conv", desc="regenerate", disable=not progress)
    engine_regen, closing = None, []
    if backend == "dspark":
        engine_regen = EngineRegenerator(target, cfg, concurrency, capture=capture_dir is not None)
        worker, step = engine_regen.answer, max(batch_size, 4 * concurrency)
        engine_regen.on_finished = bar.update  # the bar moves as each conversation ends, not once per batch
    elif backend == "openai":
        from .regen_server import ServerRegenerator

        srv, positions = ServerRegenerator(target, cfg, concurrency, server), checks.positions_of(target)
        worker, step = (lambda recs: srv.answer(_Conversations(recs, cfg, positions))), max(batch_size, 4 * concurrency)
    elif backend == "vllm":
        from .regen_vllm import VLLMRegenerator

        vllm = VLLMRegenerator(target, cfg, concurrency)
        worker, step = (lambda recs: _answer_batch(target, recs, cfg, vllm.sample)), max(batch_size, 4 * concurrency)
        closing.append(vllm.close)
    else:
        worker, step = (lambda recs: _answer_batch(target, recs, cfg)), batch_size
    start = time.perf_counter()  # the rate counts answering, not starting a backend (``setup_s``)
    stats["setup_s"] = start - setup
    try:
        for b in range(0, len(todo), step):
            rows, n_tok, dropped = worker(todo[b : b + step])
            if capture_dir is not None and rows:  # before the rows: a row on file may lack features, never the reverse
                stats["captured"] = stats.get("captured", 0) + save_captured(
                    capture_dir, engine_regen.take_captured(row["id"] for row in rows)
                )
            if rows:  # one durable append per batch; a failed one (a full disk) is cut back, never half a row
                append_durable(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
            stats["written"] += len(rows)
            stats["dropped_empty"] += dropped
            stats["tokens"] += n_tok
            if engine_regen is None:
                bar.update(len(rows) + dropped)
            bar.set_postfix(tok_s=f"{stats['tokens'] / max(time.perf_counter() - start, 1e-9):.1f}")
        stats["seconds"] = time.perf_counter() - start
    finally:
        for close in closing:
            close()
    bar.close()
    if engine_regen is not None:
        stats["prompt_tokens"] = engine_regen.prompt_tokens
    stats["tokens_per_s"] = stats["tokens"] / stats["seconds"] if stats["seconds"] > 0 else 0.0
    if stats["dropped_empty"]:
        log.warning("regenerate: dropped %d conversations with an empty response", stats["dropped_empty"])
    return stats


def save_captured(directory: str | os.PathLike, captured: dict[str, dict[str, Any]]) -> int:
    """Write one batch of captured features (``{id: {"tokens", "context", "hidden"}}``) as a new ``part-*.pt`` file
    of ``directory``, atomically; returns how many conversations it holds."""
    import io

    if not captured:
        return 0
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    torch.save(captured, buf)
    k = len(list(d.glob("part-*.pt")))
    while (d / f"part-{k:05d}.pt").exists():
        k += 1
    atomic_write(d / f"part-{k:05d}.pt", buf.getvalue())
    return len(captured)


def load_captured(directory: str | os.PathLike) -> Iterable[dict[str, dict[str, Any]]]:
    """The batches :func:`save_captured` wrote into ``directory``, one dict at a time (none if it does not exist)."""
    for part in sorted(Path(directory).glob("part-*.pt")):
        yield torch.load(part, map_location="cpu", weights_only=True)


def load_conversations(path: str | os.PathLike) -> list[dict]:
    """Read regenerated rows for training; raises on a missing/empty file, a malformed line or a duplicate id.

    A truncated final line (an interrupted write) is skipped with a warning.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"conversation file {path} does not exist")
    scan = _scan_rows(path)
    rows, truncated_at = scan.rows, scan.truncated_at
    if truncated_at is not None:
        msg = f"{path}: ignoring a truncated last line at byte {truncated_at} (interrupted write; a resume removes it)"
        warnings.warn(msg, stacklevel=2)
        log.warning(msg)
    seen: dict[str, int] = {}
    for lineno, row in rows:
        turns = row.get("turns")
        ok = (
            isinstance(turns, list)
            and turns
            and all(
                isinstance(m, dict) and m.get("role") in _ROLES and isinstance(m.get("content"), str) for m in turns
            )
        )
        if not ok or not any(m["role"] == "assistant" for m in turns):
            raise ValueError(
                f'{path}:{lineno}: "turns" must be a list of {{"role", "content"}} messages with an assistant turn'
            )
        if row["id"] in seen:
            raise ValueError(f"{path}:{lineno}: id {row['id']!r} already on line {seen[row['id']]}")
        seen[row["id"]] = lineno
    if not rows:
        raise ValueError(f"{path}: no conversations (the file is empty)")
    return [row for _, row in rows]
