"""Dense parallel backbone: KV injection of fused target features, queries from the block only.

docs/algorithm.md §3.2."""

from __future__ import annotations

from torch import nn

from ...checks import UsageError
from ...layers import SwiGLU
from ...registry import register
from ...targets import TargetGeometry
from ..common import capture_args, init_weights
from .base import DecoderLayer, InjectedBackbone


@register("backbone", "dense")
class DenseBackbone(InjectedBackbone):
    """N_d decoder layers with the target geometry; full attention (or a sliding window).

    Args:
        geometry: target shapes (supplied by the framework).
        num_layers: drafter depth N_d (5 offline, 3 in production).
        qk_norm: Qwen3-style per-head q/k RMSNorm.
        sliding_window: attend only to the last W context positions before the anchor (None = full).
        context_state: add W_s·h^T_{a-1}, the target's final hidden state of the last context position, to every
            block input (W_s zero-initialised; a deviation from the paper, ablated in benchmarks/results/matrix.md).
    """

    def __init__(
        self,
        geometry: TargetGeometry,
        num_layers: int = 5,
        qk_norm: bool = True,
        sliding_window: int | None = None,
        context_state: bool = False,
    ) -> None:
        super().__init__()
        self.hparams = capture_args(locals())
        g = geometry
        self._build_common(g, context_state)
        if sliding_window is not None and (isinstance(sliding_window, bool) or not isinstance(sliding_window, int)
                                           or sliding_window < 1):  # fmt: skip
            raise UsageError(f"sliding_window must be an integer >= 1 or null (full context), got {sliding_window!r}")
        self.sliding_window = sliding_window
        self.layer_windows = [sliding_window] * num_layers
        mlp = lambda: SwiGLU(g.hidden_size, g.intermediate_size)  # noqa: E731
        self.layers = nn.ModuleList(DecoderLayer(g, qk_norm, mlp()) for _ in range(num_layers))
        self.apply(init_weights)
        self.zero_state_proj()
