"""Mixture-of-experts MLP: a top-k router over SwiGLU experts, an optional shared expert, load balancing.

Config-free (flat typed arguments). Two balancing mechanisms:
- ``aux``: the Switch-Transformer auxiliary loss E * sum_i f_i * P_i (f_i = fraction of routed
  slots sent to expert i, P_i = mean router probability of i), exposed as ``aux_loss`` after each
  forward for the caller to add to its loss;
- ``bias``: auxiliary-loss-free balancing (DeepSeek-V3): a per-expert bias added to the scores for
  the top-k choice only, nudged after every training forward towards under-loaded experts.
Either way ``load`` holds the fraction of routed slots each expert received in the last forward.
"""

from __future__ import annotations

import torch
from torch import nn

from ..checks import UsageError
from .transformer import SwiGLU

BALANCE = ("aux", "bias", "none")


def expert_counts(idx: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Routed slots per expert (E,) long, from expert ids (N, k). A scatter-add: unlike ``torch.bincount``, whose
    CUDA kernel reads the ids' min and max on the host to size its output, it needs no device sync."""
    flat = idx.reshape(-1)
    return torch.zeros(num_experts, dtype=torch.long, device=idx.device).scatter_add_(0, flat, torch.ones_like(flat))


class Router(nn.Module):
    def __init__(self, dim: int, num_experts: int, top_k: int, balance: str = "aux", bias_rate: float = 1e-3) -> None:
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise UsageError(f"top_k must be in [1, num_experts={num_experts}], got {top_k}")
        if balance not in BALANCE:
            raise UsageError(f"balance must be one of {BALANCE}, got {balance!r}")
        self.num_experts, self.top_k, self.balance, self.bias_rate = num_experts, top_k, balance, bias_rate
        self.gate = nn.Linear(dim, num_experts, bias=False)
        self.register_buffer("bias", torch.zeros(num_experts), persistent=True)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (N, d) -> expert ids (N, k), combine weights (N, k), router probs (N, E), load (E,)."""
        probs = self.gate(x).float().softmax(-1)  # (N, E)
        score = probs + self.bias if self.balance == "bias" else probs
        idx = score.topk(self.top_k, dim=-1).indices  # (N, k)
        w = probs.gather(-1, idx)
        w = w / w.sum(-1, keepdim=True).clamp(min=1e-9)  # renormalised over the chosen experts
        load = expert_counts(idx, self.num_experts).float() / max(idx.numel(), 1)
        if self.balance == "bias" and self.training and x.shape[0] > 0:
            with torch.no_grad():  # under-loaded experts (load below the mean 1/E) gain score
                self.bias += self.bias_rate * torch.sign(1.0 / self.num_experts - load)
        return idx, w.to(x.dtype), probs, load


class MoE(nn.Module):
    """y = sum_{i in topk(x)} w_i * Expert_i(x) (+ SharedExpert(x)).

    Args:
        dim: model width.
        hidden: each expert's SwiGLU width.
        num_experts, top_k: routed experts and experts per token.
        shared_hidden: width of an always-on shared expert (0 = none).
        balance: ``aux``, ``bias`` or ``none`` (see module docstring).
    """

    def __init__(
        self,
        dim: int,
        hidden: int,
        num_experts: int = 8,
        top_k: int = 2,
        shared_hidden: int = 0,
        balance: str = "aux",
        bias_rate: float = 1e-3,
    ) -> None:
        super().__init__()
        self.router = Router(dim, num_experts, top_k, balance, bias_rate)
        self.experts = nn.ModuleList(SwiGLU(dim, hidden) for _ in range(num_experts))
        self.shared = SwiGLU(dim, shared_hidden) if shared_hidden > 0 else None
        self.aux_loss = torch.zeros(())
        self.load = torch.zeros(num_experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])  # (N, d)
        idx, w, probs, load = self.router(flat)
        out = torch.zeros_like(flat)
        # Group the routed slots by expert with one stable sort; their sizes are the layer's one host read (the
        # experts' shapes depend on it), where a boolean mask per expert would read once per expert.
        k = idx.shape[-1]
        order = idx.reshape(-1).argsort(stable=True)  # (N*k,) slots by expert, each expert's in (token, slot) order
        rows_all, w_all = order // k, w.reshape(-1)[order]  # token and combine weight of each sorted slot
        sizes = expert_counts(idx, len(self.experts)).tolist()
        for expert, rows, wts in zip(self.experts, rows_all.split(sizes), w_all.split(sizes), strict=True):
            if rows.numel():  # tokens routed to this expert
                out.index_add_(0, rows, expert(flat[rows]) * wts[:, None])
        if self.shared is not None:
            out = out + self.shared(flat)
        E = self.router.num_experts
        self.load = load.detach()
        # Switch aux loss: E * sum_i f_i P_i (= 1 when perfectly balanced); differentiable through P_i.
        self.aux_loss = E * (load.detach() * probs.mean(0)).sum() if flat.shape[0] else probs.new_zeros(())
        return out.view(shape)


def moe_aux_loss(module: nn.Module) -> torch.Tensor | None:
    """Sum of ``aux_loss`` over the MoE layers (balance='aux') of a module tree, or None if it has none."""
    terms = [m.aux_loss for m in module.modules() if isinstance(m, MoE) and m.router.balance == "aux"]
    return torch.stack([t.to(terms[0].device) for t in terms]).sum() if terms else None


def moe_loads(module: nn.Module) -> list[torch.Tensor]:
    """Per MoE layer, the fraction of routed slots each expert received in the last forward."""
    return [m.load for m in module.modules() if isinstance(m, MoE)]


__all__ = ["BALANCE", "MoE", "Router", "expert_counts", "moe_aux_loss", "moe_loads"]
