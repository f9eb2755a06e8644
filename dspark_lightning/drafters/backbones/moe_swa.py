"""MoE backbone with sliding-window attention (the production DSpark configuration, docs/algorithm.md §8).

Same inputs and outputs as the dense backbone, so every head, loss, scheduler and ``decode()``
works with it unchanged. The window applies to the injected target context: a block anchored at
position a sees context positions a - W .. a - 1 in a ``sliding`` layer, 0 .. a - 1 in a ``full`` one.
"""

from __future__ import annotations

from torch import nn

from ...checks import UsageError
from ...layers import MoE
from ...registry import register
from ...targets import TargetGeometry
from ..common import capture_args, init_weights
from .base import DecoderLayer, InjectedBackbone

LAYER_TYPES = ("sliding", "full")


@register("backbone", "moe_swa")
class MoESWABackbone(InjectedBackbone):
    """N_d decoder layers with MoE MLPs and per-layer sliding or full attention over the context.

    Args:
        geometry: target shapes (supplied by the framework).
        num_layers: drafter depth (3 in production).
        layer_types: ``sliding`` or ``full`` per layer (default: all sliding).
        sliding_window: context window W of the sliding layers.
        num_experts, top_k: routed experts per layer and experts per token.
        expert_hidden: SwiGLU width of each expert (default: the target FFN width / top_k).
        shared_expert_hidden: width of an always-on shared expert (0 = none).
        balance: ``aux`` (auxiliary loss added to the training loss), ``bias`` (aux-loss-free bias updates), ``none``.
        aux_loss_weight: weight of the auxiliary loss in the training loss.
        bias_rate: step of the bias updates (``balance='bias'``).
        qk_norm: Qwen3-style per-head q/k RMSNorm.
    """

    def __init__(
        self,
        geometry: TargetGeometry,
        num_layers: int = 3,
        layer_types: list[str] | None = None,
        sliding_window: int = 128,
        num_experts: int = 8,
        top_k: int = 2,
        expert_hidden: int | None = None,
        shared_expert_hidden: int = 0,
        balance: str = "aux",
        aux_loss_weight: float = 0.01,
        bias_rate: float = 1e-3,
        qk_norm: bool = True,
    ) -> None:
        super().__init__()
        self.hparams = capture_args(locals())
        g = geometry
        types = list(layer_types) if layer_types is not None else ["sliding"] * num_layers
        if len(types) != num_layers or any(t not in LAYER_TYPES for t in types):
            raise UsageError(f"layer_types must list {num_layers} of {LAYER_TYPES}, got {layer_types}")
        if sliding_window < 1:
            raise UsageError(f"sliding_window must be >= 1, got {sliding_window}")
        self._build_common(g)
        self.layer_types = types
        self.layer_windows = [sliding_window if t == "sliding" else None for t in types]
        self.aux_loss_weight = aux_loss_weight
        hidden = expert_hidden or max(1, g.intermediate_size // top_k)

        def moe() -> MoE:
            return MoE(g.hidden_size, hidden, num_experts, top_k, shared_expert_hidden, balance, bias_rate)

        self.layers = nn.ModuleList(DecoderLayer(g, qk_norm, moe()) for _ in range(num_layers))
        self.apply(init_weights)
