"""Small helpers shared by drafter components."""

from __future__ import annotations

from typing import Any

from torch import nn


def capture_args(local_vars: dict[str, Any]) -> dict[str, Any]:
    """The constructor's own hyperparameters from ``locals()`` (drops self, geometry, token_dim)."""
    skip = {"self", "__class__", "geometry", "token_dim"}
    return {k: v for k, v in local_vars.items() if k not in skip}


def init_weights(m: nn.Module) -> None:
    """docs/algorithm.md §3.1: Linear and Embedding N(0, 0.02), zero biases (norm weights stay 1)."""
    if isinstance(m, nn.Linear):
        nn.init.normal_(m.weight, std=0.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, nn.Embedding):
        nn.init.normal_(m.weight, std=0.02)
