"""An example third-party sequential head, discovered through the ``dspark_lightning.plugins`` entry point.

``MLPMarkovHead``: B_k = MLP(W1[x_{k-1}]) W2 — a first-order transition like the vanilla head, with a
small non-linearity on the token feature. Importing this module registers it as ``seq_head/mlp_markov``;
recipes can also name the class directly:

    seq_head:
      class_path: dspark_example_head.MLPMarkovHead
      init_args: {rank: 256}
"""

from __future__ import annotations

import torch
from torch import nn

from dspark_lightning.drafters.common import capture_args, init_weights
from dspark_lightning.drafters.heads import LowRank
from dspark_lightning.registry import register
from dspark_lightning.targets import TargetGeometry


@register("seq_head", "mlp_markov")
class MLPMarkovHead(nn.Module):
    def __init__(self, geometry: TargetGeometry, rank: int = 256) -> None:
        super().__init__()
        self.hparams = capture_args(locals())  # recorded in exported drafters
        self.token_dim = rank  # width of the token feature handed to the confidence head
        self.lr = LowRank(geometry.vocab_size, rank)  # W1 (V x r) and W2 (r -> V)
        self.mlp = nn.Sequential(nn.Linear(rank, rank), nn.SiLU(), nn.Linear(rank, rank))
        self.apply(init_weights)

    def _bias(self, e: torch.Tensor) -> torch.Tensor:
        return self.lr.w2(e + self.mlp(e))

    def teacher_forced(self, h: torch.Tensor, prev: torch.Tensor):
        e = self.lr.w1(prev)  # (N, γ, r)
        return self._bias(e), e

    def init_state(self, n: int, ref: torch.Tensor):
        return None

    def step(self, h: torch.Tensor, prev: torch.Tensor, state):
        e = self.lr.w1(prev)  # (N, r)
        return self._bias(e), e, None
