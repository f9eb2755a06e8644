"""What every regeneration backend shares: the backend contract and the bookkeeping of a batch of conversations.

A backend (registry kind ``regen_backend``, named by ``data.regen.backend``) answers a batch of prompt records with
the target, every user turn in order from the regenerated history, and returns their rows: :class:`RegenBackend`.
Built in: ``dspark`` (regen_engine.py), ``hf`` (regen_hf.py), ``openai`` (regen_server.py), ``vllm``
(regen_vllm.py). Each (conversation, turn) samples from a stream seeded by (seed, id, turn) (:func:`row_seed`), so a
row's response does not depend on which rows share its batch and a resume reproduces it.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
from collections.abc import Iterable
from typing import Any, ClassVar

from ... import checks
from ...registry import build
from ..prompts.sources import PromptRecord

log = logging.getLogger(__name__)


class RegenBackend:
    """How the target's answers are made. A backend's own settings are its constructor's keyword arguments, typed and
    checked there; each is kept as the attribute of its name, and those not in :attr:`transient` are recorded in
    every row's ``gen`` and enter the data fingerprint. The constructor only holds settings (it runs while a recipe is
    read); :func:`~dspark_lightning.data.regen.regenerate.regenerate` then calls :meth:`start` with the target and the
    row settings (``settings``: sampling, ``max_new_tokens``, ``max_turns``, ``seed``: what each row records in
    ``gen``), :meth:`answer` on batches of :attr:`step` records, then :meth:`close`.

    A subclass registered with ``@register("regen_backend", name)`` is ``data.regen.backend: name`` in a recipe, or
    ``{class_path: name, init_args: {...}}`` with settings, the same spelling on the command line and in Python; a
    plugin adds one without editing the package (``testing.check_regen_backend`` checks it).
    """

    captures_features: ClassVar[bool] = False
    """it can keep the target features its decoding computes (``data.regen.capture_features``)"""
    reports_progress: ClassVar[bool] = False
    """it calls :attr:`on_finished` as each conversation ends (else progress moves a batch at a time)"""
    concurrent: ClassVar[bool] = True
    """``concurrency`` requests run at once: a call answers ``max(batch_size, 4 * concurrency)`` records (else
    ``batch_size``)"""
    transient: ClassVar[tuple[str, ...]] = ()
    """settings that never change the answers (a timeout, retries): not recorded, not in the fingerprint"""

    def start(self, target: Any, settings: dict[str, Any], *, concurrency: int = 32, batch_size: int = 8,
              capture: bool = False) -> None:  # fmt: skip
        """Bind the backend to ``target`` for one regeneration (a subclass starts its engine here, after this)."""
        self.target, self.settings = target, settings
        self.concurrency, self.capture = concurrency, capture
        # records per :meth:`answer` call (the rows are written after each)
        self.step = max(batch_size, 4 * concurrency) if self.concurrent else batch_size
        self.prompt_tokens = 0  # rendered prompt tokens asked so far (the prefill work)
        self.on_finished: Any = None

    @property
    def name(self) -> str:
        """The registered name (or the import path of an unregistered class) that ``gen.backend`` records."""
        cls = type(self)
        return cls.__dict__.get("registry_name") or f"{cls.__module__}.{cls.__qualname__}"

    def identity(self) -> dict[str, Any]:
        """The settings the answers depend on: every constructor argument but the :attr:`transient` ones."""
        params = inspect.signature(type(self).__init__).parameters.values()
        named = [p.name for p in params if p.name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        return {n: getattr(self, n) for n in named if n not in self.transient}

    def answer(self, recs: list[PromptRecord]) -> tuple[list[dict], int, int]:
        """Every turn of ``recs``: (rows of the kept conversations in input order, generated tokens, conversations
        dropped for an empty response or a prompt longer than the target's positions)."""
        raise NotImplementedError

    def take_captured(self, ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The captured features of ``ids`` (backends with :attr:`captures_features`), forgotten by the backend."""
        return {}

    def close(self) -> None:
        """End what the backend started (an engine process); called once, also after an error."""

    def conversations(self, recs: list[PromptRecord]) -> Conversations:
        return Conversations(recs, self.settings, checks.positions_of(self.target))


def as_backend(spec: Any, what: str = "data.regen.backend") -> RegenBackend:
    """The backend ``spec`` names (a registered name or ``{class_path, init_args}``), built; a backend as given."""
    backend = spec if isinstance(spec, RegenBackend) else build("regen_backend", spec)
    if not isinstance(backend, RegenBackend):
        raise checks.UsageError(f"{what}: {spec!r} is not a RegenBackend")
    return backend


class TurnByTurnBackend(RegenBackend):
    """A backend that answers turn t of every conversation of a batch in one call of :meth:`sample`."""

    def sample(self, prompts: list[list[int]], seeds: list[int], budgets: list[int]) -> list[tuple[str, int, bool]]:
        """One turn of each prompt (token ids, its seed, the new tokens it may take): (response text, generated
        tokens, stopped) each, as :func:`split_output` makes them."""
        raise NotImplementedError

    def answer(self, recs: list[PromptRecord]) -> tuple[list[dict], int, int]:
        conv = self.conversations(recs)
        for t in range(max(len(x) for x in conv.turns)):
            idx = [i for i in sorted(conv.alive) if t < len(conv.turns[i])]
            asked = {i: conv.ask(self.target, i, t) for i in idx}
            budgets = {i: conv.budget(i, asked[i][0]) for i in idx}
            idx = [i for i in idx if budgets[i]]
            if not idx:
                break
            outs = self.sample([asked[i][0] for i in idx], [asked[i][1] for i in idx], [budgets[i] for i in idx])
            for i, out in zip(idx, outs, strict=True):
                conv.answer(i, *out)
        self.prompt_tokens += conv.prompt_tokens
        return conv.result()


def row_seed(seed: int, record_id: str, turn: int) -> int:
    digest = hashlib.sha256(f"regen:{seed}:{record_id}:{turn}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & (2**63 - 1)


def system_turn(rec: PromptRecord) -> list[dict[str, str]]:
    """A conversation's own system message (kept in its row, rendered by the chat template), if it has one."""
    return [{"role": "system", "content": rec.system}] if rec.system else []


def split_output(target: Any, out: list[int]) -> tuple[str, int, bool]:
    """Generated ids -> (text before the first stop token, tokens generated, stopped)."""
    stop = set(target.stop_token_ids)
    cut = next((j for j, t in enumerate(out) if t in stop), None)
    body = out if cut is None else out[:cut]
    stopped = cut is not None
    return target.tokenizer.decode(body, skip_special_tokens=True).strip(), len(body) + stopped, stopped


class Conversations:
    """Bookkeeping of a batch of conversations being answered turn by turn: histories, budgets, results (every
    backend keeps its batch in one)."""

    def __init__(self, recs: list[PromptRecord], cfg: dict[str, Any], positions: int | None = None) -> None:
        limit = cfg["max_turns"]
        self.recs, self.cfg, self.positions = recs, cfg, positions
        self.clamped = self.too_long = 0  # turns cut to the target's positions, conversations that did not fit
        self.turns = [r.turns if limit is None else r.turns[:limit] for r in recs]
        self.history: list[list[dict[str, str]]] = [system_turn(r) for r in recs]
        self.n_tok: list[list[int]] = [[] for _ in recs]
        self.stopped: list[list[bool]] = [[] for _ in recs]
        self.alive, self.tokens = set(range(len(recs))), 0
        self.prompt_tokens = 0  # rendered prompt tokens of the turns asked (the prefill work)

    def ask(self, target: Any, i: int, t: int) -> tuple[list[int], int]:
        """Append user turn t of conversation i; returns its rendered prompt ids and its sampling seed."""
        self.history[i].append({"role": "user", "content": self.turns[i][t]})
        prompt = target.encode_prompt(self.history[i])
        self.prompt_tokens += len(prompt)
        return prompt, row_seed(self.cfg["seed"], self.recs[i].id, t)

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
