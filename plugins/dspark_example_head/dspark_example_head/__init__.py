"""Example third-party sequential heads, discovered through the ``dspark_lightning.plugins`` entry point.

- ``MLPMarkovHead`` (``seq_head/mlp_markov``): B_k = MLP(W1[x_{k-1}]) W2, a first-order transition like the
  vanilla head with a small non-linearity on the token feature.
- ``BigramMarkovHead`` (``seq_head/bigram_markov``): B_k = (W1[x_{k-1}] + U[x_{k-2}]) W2, conditioning on the
  previous *two* tokens; its step state is the token before the previous one.

Importing this module registers both. Recipes name them by class path::

    seq_head:
      class_path: dspark_example_head.BigramMarkovHead
      init_args: {rank: 256}

and Python by name: ``create("drafter", "dspark", target, seq_head="bigram_markov")``.
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
        self.lr = LowRank(geometry.vocab_size, rank, geometry.out_vocab)  # W1 (V x r), W2 (r -> draft vocab)
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


@register("seq_head", "bigram_markov")
class BigramMarkovHead(nn.Module):
    """B_k = (W1[x_{k-1}] + U[x_{k-2}]) W2. At k = 1 the token before the anchor is a learned start row U[V]."""

    def __init__(self, geometry: TargetGeometry, rank: int = 256) -> None:
        super().__init__()
        self.hparams = capture_args(locals())
        self.token_dim = rank
        self.vocab_size = geometry.vocab_size
        self.lr = LowRank(geometry.vocab_size, rank, geometry.out_vocab)  # W1 (previous token), W2
        self.u = nn.Embedding(geometry.vocab_size + 1, rank)  # U (token before the previous one; row V = start)
        self.apply(init_weights)

    def teacher_forced(self, h: torch.Tensor, prev: torch.Tensor):
        start = prev.new_full((prev.shape[0], 1), self.vocab_size)
        prev2 = torch.cat([start, prev[:, :-1]], dim=1)  # (N, γ) x_{k-2}
        e = self.lr.w1(prev)  # (N, γ, r)
        return self.lr.w2(e + self.u(prev2)), e

    def init_state(self, n: int, ref: torch.Tensor):
        return torch.full((n,), self.vocab_size, dtype=torch.long, device=ref.device)  # x_{-1} = start

    def step(self, h: torch.Tensor, prev: torch.Tensor, state: torch.Tensor):
        e = self.lr.w1(prev)  # (N, r)
        return self.lr.w2(e + self.u(state)), e, prev  # the next step's x_{k-2} is this step's x_{k-1}
