"""Per-position analytic acceptance, pooled per domain (synchronised across DDP ranks by torchmetrics)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torchmetrics import Metric


class PositionAcceptance(Metric):
    """Accumulates Σ v·c*_k and Σ v per block position k and domain (the last row pools all domains), and the
    expected accepted length of each block, τ_b = 1 + Σ_k Π_{i<=k} v_i·c*_{b,i} (SPEC §2: per-block products
    averaged over blocks; the product of per-position means is biased low, since E[Π] != Π E).

    ``compute()`` returns (num, den, tau_sum, blocks): (len(domains)+1, γ) twice, then (len(domains)+1,) twice;
    mean acceptance = num / den, τ̂ = tau_sum / blocks.
    """

    full_state_update = False

    def __init__(self, block_size: int, domains: Sequence[str]) -> None:
        super().__init__()
        self.domains = list(domains)
        shape = (len(self.domains) + 1, block_size)
        self.add_state("num", default=torch.zeros(shape, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("den", default=torch.zeros(shape, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("tau_sum", default=torch.zeros(shape[0], dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("blocks", default=torch.zeros(shape[0], dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, acc: torch.Tensor, mask: torch.Tensor, domains: Sequence[str]) -> None:
        """acc, mask (N, γ); domains: N domain names (unknown ones count as the last listed domain)."""
        idx = torch.tensor(
            [self.domains.index(d) if d in self.domains else len(self.domains) - 1 for d in domains],
            device=acc.device,
        )
        rows = torch.nn.functional.one_hot(idx, len(self.domains) + 1).double()  # (N, D+1)
        rows[:, -1] = 1.0  # every row also counts towards "all"
        self.num = self.num + rows.T @ (acc * mask).double()  # out of place: states may be inference tensors
        self.den = self.den + rows.T @ mask.double()
        counted = mask[:, 0].double()  # a block counts when its first position is supervised
        tau = 1.0 + (acc * mask).double().cumprod(-1).sum(-1)  # (N,) unsupervised positions end the product
        self.tau_sum = self.tau_sum + rows.T @ (tau * counted)
        self.blocks = self.blocks + rows.T @ counted

    def compute(self) -> tuple[torch.Tensor, ...]:
        return self.num, self.den, self.tau_sum, self.blocks
