"""The rows STS is fitted on (:mod:`.sts` holds the maths): rollouts of real speculative decoding with full-length
verification on prompts held out from training and from ``eval``, and their split into fitting and held-out rounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from ..atomic import atomic_writer
from ..checks import UsageError
from ..data.prompts.evalsets import calibration_records
from ..data.prompts.evalsets import heldout_prompts as responses_prompts
from ..infer import decode
from .confidence import Rows


def calibration_prompts(domains: list[str], n: int, prompts_file: str | Path | None = None) -> dict[str, list[str]]:
    """Up to ``n`` first user turns per domain: from a responses JSONL (a recipe's held-out split,
    ``<work_dir>/responses_heldout.jsonl``: the prompts the drafter will serve) when given, else from the STS pool
    (disjoint from training and from `eval`'s sets). A domain the file lacks is left out."""
    if prompts_file is not None:
        return responses_prompts(prompts_file, n, tuple(domains))
    return {dom: [r.turns[0] for r in calibration_records(dom, n)] for dom in domains}


@dataclass
class Rollouts:
    """Per request-round records of full-length decoding: what STS fits and what the report scores."""

    z: torch.Tensor  # (N, γ) raw confidence logits (empty (N, 0) for a drafter without a head)
    m: torch.Tensor  # (N,) accepted drafts
    ell: torch.Tensor  # (N,) effective verified lengths
    prompt: torch.Tensor  # (N,) index of the prompt the round belongs to
    mu: torch.Tensor | None = None  # (N, γ) top-2 margins of the draft logits (None in files that predate them)

    def rows(self, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.z[mask], self.m[mask], self.ell[mask]

    def confidence_rows(self, mask: torch.Tensor) -> Rows:
        """The rounds of ``mask`` as :class:`~.confidence.Rows` (head logits None for a drafter without a head)."""
        if self.mu is None:
            raise UsageError("these rollouts hold no draft margins (recorded by an older version): record them again")
        z = self.z[mask] if self.z.shape[1] else None
        return Rows(z, self.mu[mask], self.m[mask], self.ell[mask])

    def save(self, path) -> None:
        with atomic_writer(path) as f:  # all or nothing
            torch.save({k: v for k in ("z", "m", "ell", "prompt", "mu") if (v := getattr(self, k)) is not None}, f)

    @classmethod
    def load(cls, path) -> Rollouts:
        return cls(**torch.load(path, weights_only=True))


def rollouts(target, drafter, prompts, *, temperature: float, max_new_tokens: int, seed: int = 0, batch_size=8,
             acceptance: str = "rejection", progress: bool = False) -> Rollouts:  # fmt: skip
    """Real speculative decoding with full-length verification (ℓ = γ) and raw confidences, per round, under the
    ``acceptance`` mode (the event the rounds record)."""
    res = decode(
        target,
        drafter,
        prompts,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        scheduler="static",
        seed=seed,
        batch_size=batch_size,
        calibrated=False,
        acceptance=acceptance,
        progress=progress,
    )
    log = res.log
    n = len(log.accepted)
    if not n:
        raise UsageError("the rollouts hold no drafted round (every request ended at its first token)")
    return Rollouts(
        torch.stack(log.conf_logits).double() if log.conf_logits else torch.zeros(n, 0, dtype=torch.float64),
        torch.tensor(log.accepted),
        torch.tensor(log.ell),
        torch.tensor(log.request),
        torch.stack(log.margins).double(),
    )


def heldout_prompts(counts: list[int], fraction: float) -> list[int]:
    """Indices of the held-out prompts in a domain-major list with ``counts`` prompts per domain: every
    1/fraction-th prompt of each domain's run (interleaved, so both splits cover every domain and the same prompt
    lengths); their rounds are never used by the fit."""
    if not 0 <= fraction < 1:
        raise UsageError(f"heldout_fraction must be in [0, 1), got {fraction}")
    out, start = [], 0
    for n in counts:
        out += [start + i for i in range(n) if math.floor((i + 1) * fraction) > math.floor(i * fraction)]
        start += n
    return out
