"""Sequential heads (docs/algorithm.md §3.5): a bias B_k on the base logits from the previously sampled token.

All heads share the small :class:`SeqHead` protocol; they are siblings, not subclasses. Each
owns a :class:`LowRank` pair W1 (V x r lookup) and W2 (r -> V, no bias). W1[x_{k-1}] is also
the token feature the confidence head reads.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from ...registry import register
from ...targets import TargetGeometry
from ..common import capture_args, init_weights


@runtime_checkable
class SeqHead(Protocol):
    """A sequential head. To be exported for servers a head class also declares ``serving_type`` (the
    ``markov_head_type`` servers know it by) and ``serving_weights`` (its parameter-name prefixes -> the servers' names
    under ``markov_head.``); a head without them trains and decodes here and is refused by the export, naming it."""

    token_dim: int  # r, the width of W1[x] handed to the confidence head

    def teacher_forced(self, h: torch.Tensor, prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """h (N, γ, d), prev (N, γ) data tokens [x_a, y_1..y_{γ-1}] -> bias (N, γ, V), W1[prev] (N, γ, r)."""
        ...

    def init_state(self, n: int, ref: torch.Tensor) -> Any:
        """Per-block state at k = 1 (s_0 = 0 for the RNN; None for stateless heads)."""
        ...

    def step(self, h: torch.Tensor, prev: torch.Tensor, state: Any) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """One inference step: h (N, d), prev (N,) -> bias (N, V), W1[prev] (N, r), next state."""
        ...


LOW_RANK_WEIGHTS = (("lr.w1.", "markov_w1."), ("lr.w2.", "markov_w2."))  # W1, W2 under their serving names


class LowRank(nn.Module):
    """W1 (lookup of the previous token, any target token) and W2 (r -> the draft vocabulary)."""

    def __init__(self, vocab_size: int, rank: int, out_size: int | None = None) -> None:
        super().__init__()
        self.w1 = nn.Embedding(vocab_size, rank)
        self.w2 = nn.Linear(rank, out_size or vocab_size, bias=False)


@register("seq_head", "vanilla")
class VanillaMarkovHead(nn.Module):
    """B_k = W1[x_{k-1}] W2: first-order low-rank transition, independent of h_k (paper Eq. 5)."""

    serving_type = "vanilla"
    serving_weights = LOW_RANK_WEIGHTS

    def __init__(self, geometry: TargetGeometry, rank: int = 256) -> None:
        super().__init__()
        self.hparams = capture_args(locals())
        self.token_dim = rank
        self.lr = LowRank(geometry.vocab_size, rank, geometry.out_vocab)
        self.apply(init_weights)

    def teacher_forced(self, h, prev):
        e = self.lr.w1(prev)  # (N, γ, r), or (N, r) for one step
        return self.lr.w2(e), e

    def init_state(self, n, ref):
        return None

    def step(self, h, prev, state):
        return (*self.teacher_forced(h, prev), None)


@register("seq_head", "gated")
class GatedMarkovHead(nn.Module):
    """B_k = (g_k * W1[x_{k-1}]) W2 with g_k = sigmoid(W_g [h_k; W1[x_{k-1}]] + b_g) (reference only)."""

    serving_type = "gated"
    serving_weights = (*LOW_RANK_WEIGHTS, ("gate.", "gate_proj."))  # SGLang's names

    def __init__(self, geometry: TargetGeometry, rank: int = 256) -> None:
        super().__init__()
        self.hparams = capture_args(locals())
        self.token_dim = rank
        self.lr = LowRank(geometry.vocab_size, rank, geometry.out_vocab)
        self.gate = nn.Linear(geometry.hidden_size + rank, rank)
        self.apply(init_weights)

    def teacher_forced(self, h, prev):
        e = self.lr.w1(prev)
        g = torch.sigmoid(self.gate(torch.cat([h, e], dim=-1)))
        return self.lr.w2(g * e), e

    def init_state(self, n, ref):
        return None

    def step(self, h, prev, state):
        return (*self.teacher_forced(h, prev), None)


@register("seq_head", "rnn")
class RNNHead(nn.Module):
    """Paper Eq. 6. u_k = [s_{k-1}; W1[x_{k-1}]; h_k]; [g; c~; o] = Linear(u_k); B_k = tanh(o) W2;
    s_k = sigmoid(g) * s_{k-1} + (1 - sigmoid(g)) * tanh(c~). B_k uses the old state; s_0 = 0 per block.
    """

    serving_type = "rnn"
    serving_weights = (*LOW_RANK_WEIGHTS, ("cell.", "joint_proj."))  # SGLang's names

    def __init__(self, geometry: TargetGeometry, rank: int = 256) -> None:
        super().__init__()
        self.hparams = capture_args(locals())
        self.token_dim = self.rank = rank
        self.lr = LowRank(geometry.vocab_size, rank, geometry.out_vocab)
        self.cell = nn.Linear(2 * rank + geometry.hidden_size, 3 * rank)
        self.apply(init_weights)

    def init_state(self, n, ref):
        return ref.new_zeros(n, self.rank)

    def step(self, h, prev, state):
        e = self.lr.w1(prev)  # (N, r)
        g, c, o = self.cell(torch.cat([state, e, h], dim=-1)).split(self.rank, dim=-1)
        bias = self.lr.w2(torch.tanh(o))
        gate = torch.sigmoid(g)
        return bias, e, gate * state + (1 - gate) * torch.tanh(c)

    def teacher_forced(self, h, prev):
        state = self.init_state(h.shape[0], h)
        biases, feats = [], []
        for k in range(h.shape[1]):  # unrolled over γ, parallel over blocks
            b, e, state = self.step(h[:, k], prev[:, k], state)
            biases.append(b)
            feats.append(e)
        return torch.stack(biases, 1), torch.stack(feats, 1)
