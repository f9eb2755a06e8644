"""Draft-vocabulary selection (FR-Spec / EAGLE-3): the N most frequent target tokens of the training responses.

counts = response_token_counts(rows, vocab_size)       # supervised (response) tokens only
ids = frequent_tokens(counts, 8192, always=target.stop_token_ids)
coverage(counts_heldout, ids)                          # share of held-out response tokens inside ids
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ...checks import UsageError


def response_token_counts(rows: Iterable[dict], vocab_size: int) -> torch.Tensor:
    """Occurrences (V,) of every token at supervised positions (loss_mask = 1) of tokenised conversations."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for r in rows:
        ids = torch.as_tensor(r["input_ids"], dtype=torch.long)
        mask = torch.as_tensor(r["loss_mask"], dtype=torch.bool)
        counts += torch.bincount(ids[mask], minlength=vocab_size)
    return counts


def frequent_tokens(counts: torch.Tensor, n: int, always: Iterable[int] = ()) -> torch.Tensor:
    """The ``n`` most frequent token ids (ties by id), always including ``always`` (stop tokens); sorted."""
    V = counts.numel()
    if not 0 < n <= V:
        raise UsageError(f"draft_vocab_size must be in [1, {V}], got {n}")
    forced = sorted({int(t) for t in always if 0 <= int(t) < V})
    if len(forced) > n:
        raise UsageError(f"draft_vocab_size {n} cannot hold the {len(forced)} stop tokens")
    score = counts.double().clone()
    score[forced] = float("inf")
    order = torch.argsort(-score, stable=True)  # most frequent first, ties by smaller id
    return order[:n].sort().values


def coverage(counts: torch.Tensor, ids: torch.Tensor) -> float:
    """Share of the counted tokens that fall inside ``ids``."""
    total = int(counts.sum())
    return float(counts[ids].sum()) / total if total else 0.0
