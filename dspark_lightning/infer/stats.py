"""Decoding metrics with the docs/algorithm.md §2 definitions, pooled over request-rounds.

For round i: l_i effective drafts verified (j for a round ended by an accepted stop token at
draft j), m_i accepted drafts, e_i committed tokens (m_i + 1, or m_i after an accepted stop).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch


@dataclass
class RoundLog:
    """Per request-round records, appended by the decoding engine."""

    ell: list[int] = field(default_factory=list)  # effective verification length l_i
    accepted: list[int] = field(default_factory=list)  # m_i
    committed: list[int] = field(default_factory=list)  # e_i
    request: list[int] = field(default_factory=list)  # request index (prompt order)
    survival: list[torch.Tensor] = field(default_factory=list)  # (γ,) a_{i,k} the scheduler saw (empty w/o drafter)
    conf_logits: list[torch.Tensor] = field(default_factory=list)  # (γ,) raw confidence logits (drafters with a head)
    margins: list[torch.Tensor] = field(default_factory=list)  # (γ,) top-2 logit margins of the draft laws
    step_tokens: list[int] = field(default_factory=list)  # per batched step: B = sum_r (1 + l_r)
    step_requests: list[int] = field(default_factory=list)  # per batched step: R
    skipped_steps: int = 0  # steps where the scheduler skipped the drafter (l = 0 for every request, no draft)

    def add(
        self,
        request: int,
        ell: int,
        m: int,
        e: int,
        a: torch.Tensor | None,
        z: torch.Tensor | None = None,
        margin: torch.Tensor | None = None,
    ):
        self.request.append(request)
        self.ell.append(ell)
        self.accepted.append(m)
        self.committed.append(e)
        if a is not None:
            self.survival.append(a)
        if z is not None:
            self.conf_logits.append(z)
        if margin is not None:
            self.margins.append(margin)


def position_rates(ell: torch.Tensor, m: torch.Tensor, g: int) -> tuple[list[float | None], list[float | None]]:
    """Unconditional survival S_k = #{m>=k}/#{l>=k} and conditional acceptance A_k = #{m>=k}/#{l>=k, m>=k-1}."""
    S, A = [], []
    for k in range(1, g + 1):
        hit = int((m >= k).sum())
        n_s = int((ell >= k).sum())
        n_a = int(((ell >= k) & (m >= k - 1)).sum())
        S.append(hit / n_s if n_s else None)
        A.append(hit / n_a if n_a else None)
    return S, A


@dataclass
class DecodeStats:
    rounds: int  # request-rounds (the first token after prefill is not a round)
    steps: int  # batched target forwards after prefill
    tau: float  # Σ e_i / #rounds, bonus included, in [1, γ+1]
    acceptance_rate: float | None  # α = Σ m_i / Σ l_i (bonus excluded)
    verify_rate: float  # Σ e_i / Σ (l_i + 1) (bonus included)
    survival: list[float | None]  # S_k, k = 1..γ
    conditional_acceptance: list[float | None]  # A_k, k = 1..γ
    mean_verify_len: float  # mean l_i per request-round
    mean_step_tokens: float  # mean B = Σ_r (1 + l_r) per batched step
    skipped_steps: int  # steps that did not run the drafter (the scheduler judged drafting not worth it)
    generated_tokens: int
    prompts: int
    time_s: dict[str, float]  # prefill, draft, schedule, verify, accept, total
    tokens_per_s: float  # generated tokens / total wall time (prefill included)
    decode_tokens_per_s: float  # generated tokens / (total - prefill)
    block_size: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        t = self.time_s
        split = " ".join(f"{k} {t[k]:.2f}s" for k in ("prefill", "draft", "schedule", "verify", "accept"))
        alpha = "n/a" if self.acceptance_rate is None else f"{self.acceptance_rate:.3f}"
        return (
            f"tau {self.tau:.3f} | acceptance {alpha} | verify rate {self.verify_rate:.3f} | "
            f"rounds {self.rounds} | mean l {self.mean_verify_len:.2f} | "
            f"skipped drafts {self.skipped_steps}/{self.steps} | "
            f"{self.generated_tokens} tokens in {t['total']:.2f}s = {self.tokens_per_s:.1f} tok/s | {split}"
        )


def summarize(log: RoundLog, block_size: int, generated: int, prompts: int, time_s: dict[str, float]) -> DecodeStats:
    ell = torch.tensor(log.ell, dtype=torch.long)
    m = torch.tensor(log.accepted, dtype=torch.long)
    e = torch.tensor(log.committed, dtype=torch.long)
    n = len(log.ell)
    S, A = position_rates(ell, m, block_size)
    total = time_s.get("total", 0.0)
    decode_time = total - time_s.get("prefill", 0.0)
    return DecodeStats(
        rounds=n,
        steps=len(log.step_tokens),
        tau=float(e.sum()) / n if n else 0.0,
        acceptance_rate=float(m.sum()) / float(ell.sum()) if int(ell.sum()) else None,
        verify_rate=float(e.sum()) / float((ell + 1).sum()) if n else 0.0,
        survival=S,
        conditional_acceptance=A,
        mean_verify_len=float(ell.float().mean()) if n else 0.0,
        mean_step_tokens=sum(log.step_tokens) / len(log.step_tokens) if log.step_tokens else 0.0,
        skipped_steps=log.skipped_steps,
        generated_tokens=generated,
        prompts=prompts,
        time_s=time_s,
        tokens_per_s=generated / total if total > 0 else 0.0,
        decode_tokens_per_s=generated / decode_time if decode_time > 0 else 0.0,
        block_size=block_size,
    )
