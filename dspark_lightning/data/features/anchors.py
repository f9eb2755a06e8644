"""Anchor sampling and batch collation (docs/algorithm.md §4 "Anchor sampling", §3.4)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import torch


def eligible_anchors(loss_mask: torch.Tensor) -> torch.Tensor:
    """Positions t in [0, S-2] with loss_mask[t] = loss_mask[t+1] = 1: the anchor and its first label are
    response tokens, so the last prompt token is never an anchor and the first response token is never a label."""
    m = loss_mask.bool()
    return torch.nonzero(m[:-1] & m[1:], as_tuple=False).flatten()


def sample_anchors(
    loss_mask: torch.Tensor, max_anchors: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """min(#eligible, max_anchors) anchors uniformly without replacement, sorted, padded with dummies.

    Returns anchors (max_anchors,) long and valid (max_anchors,) bool; dummy anchors sit at 0 and are masked.
    """
    elig = eligible_anchors(loss_mask)
    n = min(len(elig), max_anchors)
    pick = elig[torch.randperm(len(elig), generator=generator)[:n]].sort().values
    anchors = torch.zeros(max_anchors, dtype=torch.long)
    valid = torch.zeros(max_anchors, dtype=torch.bool)
    anchors[:n], valid[:n] = pick, True
    return anchors, valid


def sample_seed(base_seed: int, epoch: int, sample_id: str) -> int:
    """Per-sample anchor seed derived from the config seed, the epoch and the sample id (reproducible on resume)."""
    h = hashlib.sha256(f"{base_seed}/{epoch}/{sample_id}".encode()).digest()
    return int.from_bytes(h[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


class AnchorCollator:
    """Pads variable-length samples into a batch and samples anchors per sequence.

    Sample dicts hold ``id``, ``input_ids`` (S,), ``loss_mask`` (S,) and optionally cached features
    ``context`` (S, n*d) and ``hidden`` (S, d). Batch keys: input_ids (B, S), loss_mask (B, S),
    attention_mask (B, S), anchors (B, A), valid (B, A) and, when present, context / hidden in the samples' dtype
    (bf16 from the streaming reader: the cast to fp32 waits until the batch is on the device).
    """

    def __init__(self, max_anchors: int, seed: int = 42, pad_id: int = 0) -> None:
        self.max_anchors, self.seed, self.pad_id = max_anchors, seed, pad_id
        self.epoch = 0  # set by the DataModule each epoch

    def __call__(self, samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        B, S = len(samples), max(len(s["input_ids"]) for s in samples)
        ids = torch.full((B, S), self.pad_id, dtype=torch.long)
        lm = torch.zeros(B, S, dtype=torch.long)
        am = torch.zeros(B, S, dtype=torch.long)
        anchors = torch.zeros(B, self.max_anchors, dtype=torch.long)
        valid = torch.zeros(B, self.max_anchors, dtype=torch.bool)
        feats = {k: [] for k in ("context", "hidden") if k in samples[0]}
        for i, s in enumerate(samples):
            n = len(s["input_ids"])
            ids[i, :n] = torch.as_tensor(s["input_ids"])
            lm[i, :n] = torch.as_tensor(s["loss_mask"])
            am[i, :n] = 1
            g = torch.Generator().manual_seed(sample_seed(self.seed, self.epoch, str(s["id"])))
            anchors[i], valid[i] = sample_anchors(lm[i, :n], self.max_anchors, g)
        batch = {"input_ids": ids, "loss_mask": lm, "attention_mask": am, "anchors": anchors, "valid": valid}
        for k in ("target_lse", "target_top"):  # cached full-vocabulary summaries of the target law (S,)
            if all(k in s for s in samples):
                out = torch.zeros(B, S, dtype=samples[0][k].dtype)
                for i, s in enumerate(samples):
                    out[i, : len(s[k])] = s[k]
                batch[k] = out
        for k in feats:
            dim = samples[0][k].shape[-1]
            out = torch.zeros(B, S, dim, dtype=samples[0][k].dtype)
            for i, s in enumerate(samples):
                out[i, : len(s[k])] = s[k]
            batch[k] = out
        batch["ids"] = [str(s["id"]) for s in samples]
        batch["domains"] = [str(s.get("domain", "")) for s in samples]
        return batch
