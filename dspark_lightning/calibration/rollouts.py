"""The rows STS is fitted on (:mod:`.sts` holds the maths): rollouts of real speculative decoding with full-length
verification on prompts held out from training and from ``eval``, and their split into fitting and held-out rounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..atomic import atomic_writer
from ..data.prompts.evalsets import calibration_records
from ..infer import decode


def calibration_prompts(domains: list[str], n: int) -> list[str]:
    """``n`` first user turns per domain from the STS pool (disjoint from training and from `eval`'s sets)."""
    return [r.turns[0] for dom in domains for r in calibration_records(dom, n)]


@dataclass
class Rollouts:
    """Per request-round records of full-length decoding: what STS fits and what the report scores."""

    z: torch.Tensor  # (N, γ) raw confidence logits
    m: torch.Tensor  # (N,) accepted drafts
    ell: torch.Tensor  # (N,) effective verified lengths
    prompt: torch.Tensor  # (N,) index of the prompt the round belongs to

    def rows(self, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.z[mask], self.m[mask], self.ell[mask]

    def save(self, path) -> None:
        with atomic_writer(path) as f:  # all or nothing
            torch.save({k: getattr(self, k) for k in ("z", "m", "ell", "prompt")}, f)

    @classmethod
    def load(cls, path) -> Rollouts:
        return cls(**torch.load(path, weights_only=True))


def rollouts(target, drafter, prompts, *, temperature: float, max_new_tokens: int, seed: int = 0, batch_size=8,
             progress: bool = False) -> Rollouts:  # fmt: skip
    """Real speculative decoding with full-length verification (ℓ = γ) and raw confidences, per round."""
    if getattr(drafter, "conf_head", None) is None:
        raise ValueError("this drafter has no confidence head to calibrate")
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
        progress=progress,
    )
    log = res.log
    return Rollouts(
        torch.stack(log.conf_logits).double(),
        torch.tensor(log.accepted),
        torch.tensor(log.ell),
        torch.tensor(log.request),
    )


def heldout_prompts(per_domain: int, domains: int, fraction: float) -> list[int]:
    """Indices of the held-out prompts: every 1/fraction-th prompt of each domain's run (interleaved, so both
    splits cover every domain and the same prompt lengths); their rounds are never used by the fit."""
    if not 0 <= fraction < 1:
        raise ValueError(f"heldout_fraction must be in [0, 1), got {fraction}")
    picks = [i for i in range(per_domain) if math.floor((i + 1) * fraction) > math.floor(i * fraction)]
    return [d * per_domain + i for d in range(domains) for i in picks]
