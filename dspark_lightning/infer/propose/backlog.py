"""Target features of steps the drafter skipped, held until it drafts again (the drafter context cache, lazily).

When the draft gate switches drafting off, every step commits exactly one token per request (its anchor). The
drafter still needs those positions' fused target features before it can draft again, but extending its context
cache on each skipped step costs a drafter-cache update per step for nothing in return. :class:`ContextBacklog`
keeps each skipped step's (context, final hidden) rows and hands them to the proposer in one ``extend`` when a
drafting step comes (or when the backlog is full), so a skipped step costs what a plain one does.

A request's backlog is always one run of consecutive positions ending just before its anchor: a skipped step
commits position ``pos`` and moves the anchor to ``pos + 1``, and any drafting step flushes first.
"""

from __future__ import annotations

import torch


class ContextBacklog:
    """Per-request queues of one-position feature rows, flushed into ``proposer.extend`` in one call."""

    def __init__(self, max_steps: int = 64) -> None:
        self.max_steps = max_steps  # a skipped step past this many flushes at once (bounded memory)
        self._steps: list[tuple[list[int], torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def __len__(self) -> int:
        return len(self._steps)

    def push(self, ids: list[int], context: torch.Tensor, hidden: torch.Tensor, pos: torch.Tensor) -> None:
        """One skipped step: rows of requests ``ids``, features (R, 1, n·d) and (R, 1, d) at host positions ``pos``."""
        self._steps.append((list(ids), context[:, :1], hidden[:, :1], pos))

    def full(self) -> bool:
        return len(self._steps) >= self.max_steps

    def flush(self, proposer, alive: list[int]) -> None:
        """Extend the proposer's cache with every held position of the requests in ``alive`` (others are gone)."""
        if not self._steps:
            return
        steps, self._steps = self._steps, []
        keep = set(alive)
        rows: dict[int, list[int]] = {}  # rid -> flat row indices, oldest first
        flat = 0
        for ids, _, _, _ in steps:
            for rid in ids:
                if rid in keep:
                    rows.setdefault(rid, []).append(flat)
                flat += 1
        if not rows:
            return
        ctx = torch.cat([c[:, 0] for _, c, _, _ in steps])  # (rows of all steps, n·d)
        hid = torch.cat([h[:, 0] for _, _, h, _ in steps])
        pos = torch.cat([p for _, _, _, p in steps]).tolist()  # host positions
        ids = list(rows)
        L = max(len(r) for r in rows.values())
        index = torch.tensor([r + [r[-1]] * (L - len(r)) for r in rows.values()]).to(ctx.device)  # (R, L)
        start = torch.tensor([pos[r[0]] for r in rows.values()])  # host, like the engine's own extends
        lengths = torch.tensor([len(r) for r in rows.values()])
        proposer.extend(ids, ctx[index], start, lengths, hidden=hid[index])
