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

The answers come from a registered ``regen_backend`` (:func:`regenerate`; the contract is
:class:`~dspark_lightning.data.regen.backend.RegenBackend`). Every backend seeds each (conversation, turn) from
(seed, id, turn), so a row's response does not depend on which other rows share its batch and a resume reproduces
the same text (up to float effects of batching).
"""

from __future__ import annotations

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
from ...checks import UsageError
from ..prompts.sources import PromptRecord
from .backend import as_backend, system_turn
from .config import RegenConfig

log = logging.getLogger(__name__)
_ROLES = ("user", "assistant", "system")


def _fixed_row(target: Any, rec: PromptRecord, cfg: dict[str, Any]) -> dict:
    """The row of a record with fixed responses: its user turns answered by its own text (up to ``max_turns``);
    ``gen.fixed`` marks it, ``new_tokens`` counts the response tokens (the target's tokenizer)."""
    n = len(rec.responses) if cfg["max_turns"] is None else min(cfg["max_turns"], len(rec.responses))
    turns: list[dict[str, str]] = system_turn(rec)
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
                raise UsageError(f"{path}:{pending[1]}: malformed row: {pending[2]}")
            try:
                row = json.loads(line)
                if not isinstance(row, dict) or not isinstance(row.get("id"), str):
                    raise UsageError('expected a JSON object with a string "id"')
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
            raise UsageError(
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
    backend: Any = "dspark",
    extra_settings: dict[str, Any] | None = None,
    **_: Any,  # batch_size, concurrency, progress: how the rows are made, not what they are
) -> dict[str, Any]:
    """What a response row depends on, recorded in its ``gen`` and compared on resume."""
    backend = as_backend(backend, "regenerate: backend")
    return {
        "temperature": float(temperature),
        "top_p": float(top_p),
        "top_k": top_k,
        "max_new_tokens": max_new_tokens,
        "seed": seed,
        "max_turns": max_turns,
        "backend": backend.name,
        **backend.identity(),
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
    backend: Any = "dspark",
    concurrency: int = 32,
    progress: bool = True,
    extra_settings: dict[str, Any] | None = None,
    capture_dir: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Answer every user turn of ``prompts`` with ``target`` and append rows to ``out_path`` (resumable).

    ``backend``: a ``regen_backend`` as a recipe names it (a registered name or ``{"class_path": name, "init_args":
    {...}}``) or built: ``dspark`` (our decoding Engine, continuous batching of up to ``concurrency`` turns; rows are
    written every ``max(batch_size, 4 * concurrency)`` conversations), ``hf`` (``generate`` on batches of
    ``batch_size``), ``openai`` (an OpenAI-compatible server, ``init_args: {base_url, model}``; ``concurrency``
    conversations in flight) or ``vllm`` (vLLM's offline engine, ``concurrency`` sequences), or a plugin's.
    ``temperature=0`` is greedy. Rows with an empty response at any turn are dropped. ``extra_settings`` are recorded
    in every row's ``gen`` and checked on resume like the sampling settings (prepare records ``regen_dtype`` there).
    ``capture_dir`` (a backend that captures features: ``dspark``): the target features of each conversation's last
    turn, as the decoding computed them, are saved there (:func:`save_captured`, one file per batch, written before
    the batch's rows) so that the feature stage needs no second forward for them (:mod:`.features`'
    ``captured_sample``).
    Returns stats:
    ``written``, ``skipped`` (already in the file), ``dropped_empty``, ``tokens``, ``setup_s`` (starting the backend),
    ``seconds`` and ``tokens_per_s`` (answering).
    """
    prompts = list(prompts)
    if not prompts:
        raise UsageError("regenerate: no prompts given")
    ids = [r.id for r in prompts]
    if len(set(ids)) != len(ids):
        seen: set[str] = set()
        dup = sorted({i for i in ids if i in seen or seen.add(i)})
        raise UsageError(f"regenerate: duplicate prompt ids {dup[:5]} (rows are keyed by id)")
    answering = as_backend(backend, "regenerate: backend")  # an unknown name lists the registered backends
    if capture_dir is not None and not answering.captures_features:
        raise UsageError(f"regenerate: backend {answering.name!r} cannot capture features (backend 'dspark' can)")
    RegenConfig(batch_size=batch_size, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                max_turns=max_turns, concurrency=concurrency, backend=answering)  # the settings' one check  # fmt: skip
    limit = checks.positions_of(target)
    if limit is not None and max_new_tokens >= limit:
        raise checks.UsageError(f"regenerate: max_new_tokens={max_new_tokens} leaves no room for a prompt in the "
                                f"{limit} positions of the target {target.name!r}; use less than {limit}")  # fmt: skip
    cfg = generation_settings(target, temperature=temperature, top_p=top_p, top_k=top_k,
                              max_new_tokens=max_new_tokens, seed=seed, max_turns=max_turns, backend=answering,
                              extra_settings=extra_settings)  # fmt: skip
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
    started = bool(todo)
    if started:
        answering.start(target, cfg, concurrency=concurrency, batch_size=batch_size, capture=capture_dir is not None)
        answering.on_finished = bar.update
    start = time.perf_counter()  # the rate counts answering, not starting a backend (``setup_s``)
    stats["setup_s"] = start - setup
    try:
        for b in range(0, len(todo), answering.step if started else 1):
            rows, n_tok, dropped = answering.answer(todo[b : b + answering.step])
            if capture_dir is not None and rows:  # before the rows: a row on file may lack features, never the reverse
                stats["captured"] = stats.get("captured", 0) + save_captured(
                    capture_dir, answering.take_captured(row["id"] for row in rows)
                )
            if rows:  # one durable append per batch; a failed one (a full disk) is cut back, never half a row
                append_durable(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
            stats["written"] += len(rows)
            stats["dropped_empty"] += dropped
            stats["tokens"] += n_tok
            if not answering.reports_progress:
                bar.update(len(rows) + dropped)
            bar.set_postfix(tok_s=f"{stats['tokens'] / max(time.perf_counter() - start, 1e-9):.1f}")
        stats["seconds"] = time.perf_counter() - start
    finally:
        if started:
            answering.close()
    bar.close()
    stats["prompt_tokens"] = answering.prompt_tokens if started else 0
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
    rows = scan.rows
    if scan.truncated_at is not None:
        _warn(f"{path}: ignoring a truncated last line at byte {scan.truncated_at} (interrupted write; a resume "
              "removes it)")  # fmt: skip
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
            raise UsageError(
                f'{path}:{lineno}: "turns" must be a list of {{"role", "content"}} messages with an assistant turn'
            )
        if row["id"] in seen:
            raise UsageError(f"{path}:{lineno}: id {row['id']!r} already on line {seen[row['id']]}")
        seen[row["id"]] = lineno
    if not rows:
        raise UsageError(f"{path}: no conversations (the file is empty)")
    return [row for _, row in rows]
