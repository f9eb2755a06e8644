"""Confidence head (docs/algorithm.md §3.6, paper Eq. 7): c_k = sigmoid(w^T [h_k; W1[x_{k-1}]] + b).

A conditional survival logit."""

from __future__ import annotations

import torch
from torch import nn

from ...registry import register
from ...targets import TargetGeometry
from ..common import capture_args, init_weights


@register("conf_head", "linear")
class ConfidenceHead(nn.Module):
    """One Linear (d + r) -> 1 with bias, returning logits.

    Args:
        geometry: target shapes (supplied by the framework).
        token_dim: width r of the sequential head's W1[x_{k-1}] feature (0 = Markov-free head on h_k only).
        detach_inputs: stop BCE gradients from reaching the backbone and W1 (default: they flow, as in the reference).
    """

    def __init__(self, geometry: TargetGeometry, token_dim: int = 0, detach_inputs: bool = False) -> None:
        super().__init__()
        self.hparams = capture_args(locals())
        self.token_dim = token_dim
        self.detach_inputs = detach_inputs
        self.proj = nn.Linear(geometry.hidden_size + token_dim, 1)
        self.apply(init_weights)

    def forward(self, h: torch.Tensor, token_feat: torch.Tensor | None) -> torch.Tensor:
        """h (..., d), token_feat (..., r) or None -> logits (...)."""
        x = h if self.token_dim == 0 else torch.cat([h, token_feat], dim=-1)
        if self.detach_inputs:
            x = x.detach()
        return self.proj(x).squeeze(-1)
