"""Regeneration by our own decoding engine (``data.regen.backend: dspark``, the default).

Plain decoding with the lean verifier (:class:`~dspark_lightning.infer.Engine`) and **continuous batching over
conversations**: up to ``concurrency`` turns decode together, and when one finishes the next waiting turn (a new
conversation, or the same conversation's next user turn) joins at once. Sampling is the runtime's law (temperature,
top-k, top-p as HF's warpers) from a per-request stream. With ``capture`` it keeps the target features the decoding
computes for each conversation's last turn, so the feature stage needs no second target pass.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...registry import register
from ..prompts.sources import PromptRecord
from .backend import RegenBackend, split_output


@register("regen_backend", "dspark")
class EngineRegenerator(RegenBackend):
    """Continuous batching over conversations with our decoding engine (see the module docstring)."""

    captures_features = reports_progress = True

    def start(self, target: Any, settings: dict[str, Any], **kw: Any) -> None:
        from ...infer.generation import FeatureTrace, generation_engine  # data/'s one seam into the runtime

        super().start(target, settings, **kw)
        self.trace = FeatureTrace() if self.capture else None
        s = settings
        self.engine = generation_engine(target, s["temperature"], s["top_k"], s["top_p"], trace=self.trace)
        self.captured: dict[str, dict[str, Any]] = {}  # record id -> its last turn's features (capture only)

    def answer(self, recs: list[PromptRecord]) -> tuple[list[dict], int, int]:
        """Regenerate every turn of ``recs``; returns (rows in input order, generated tokens, rows dropped)."""
        from collections import deque

        eng, conv = self.engine, self.conversations(recs)
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
                kept = conv.answer(i, *split_output(self.target, r.output))
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
