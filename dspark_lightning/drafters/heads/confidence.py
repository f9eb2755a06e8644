"""Confidence head (docs/algorithm.md §3.6, paper Eq. 7): c_k = sigmoid(w^T [h_k; W1[x_{k-1}]; f_k] + b).

A conditional survival logit. f_k are optional features of the draft's own logits z_k (its top-2 margin, its
entropy): free at inference, where z_k exists before the head is read and before x_k is drawn."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import nn

from ...checks import UsageError
from ...registry import register
from ...targets import TargetGeometry
from ..common import capture_args, init_weights


@register("conf_head", "linear")
class ConfidenceHead(nn.Module):
    """One Linear (d + r + f) -> 1 with bias, returning logits.

    Args:
        geometry: target shapes (supplied by the framework).
        token_dim: width r of the sequential head's W1[x_{k-1}] feature (0 = Markov-free head on h_k only).
        detach_inputs: stop BCE gradients from reaching the backbone and W1 (default: they flow, as in the reference).
        draft_features: features of the draft logits z_k appended to the input (detached): ``margin`` (top-1 minus
            top-2 logit) and ``entropy`` (of softmax z_k). Engines' confidence heads read [h; W1[x]] only, so a head
            with draft features serves in this runtime, not in an export.
    """

    def __init__(
        self,
        geometry: TargetGeometry,
        token_dim: int = 0,
        detach_inputs: bool = False,
        draft_features: Sequence[Literal["margin", "entropy"]] | None = None,
    ) -> None:
        super().__init__()
        self.hparams = capture_args(locals())
        self.token_dim = token_dim
        self.detach_inputs = detach_inputs
        self.draft_features = tuple(draft_features or ())
        bad = [f for f in self.draft_features if f not in ("margin", "entropy")]
        if bad or len(set(self.draft_features)) != len(self.draft_features):
            raise UsageError(f"draft_features are distinct names among margin, entropy; got {list(draft_features)}")
        self.proj = nn.Linear(geometry.hidden_size + token_dim + len(self.draft_features), 1)
        self.apply(init_weights)

    def features(self, logits: torch.Tensor) -> torch.Tensor:
        """(..., N) draft logits -> (..., f) detached features, in fp32."""
        z = logits.detach().float()
        out = []
        for name in self.draft_features:
            if name == "margin":
                top2 = z.topk(2, dim=-1).values
                out.append(top2[..., 0] - top2[..., 1])
            else:
                logp = z.log_softmax(-1)
                out.append(-(logp.exp() * logp.nan_to_num(0.0, 0.0, 0.0)).sum(-1))
        return torch.stack(out, -1)

    def forward(self, h: torch.Tensor, token_feat: torch.Tensor | None, logits: torch.Tensor | None = None):
        """h (..., d), token_feat (..., r) or None, logits (..., N) (needed with draft features) -> logits (...)."""
        x = h if self.token_dim == 0 else torch.cat([h, token_feat], dim=-1)
        if self.detach_inputs:
            x = x.detach()
        if self.draft_features:
            if logits is None:
                raise UsageError("this confidence head reads the draft logits (draft_features); pass them")
            x = torch.cat([x, self.features(logits).to(x.dtype)], dim=-1)
        return self.proj(x).squeeze(-1)
