"""Training precision that picks the faster of bf16 autocast and fp32 on the machine it runs on.

On CUDA bf16 autocast is always the faster. On a CPU it depends on the chip: with native bf16 matrix instructions a
training step in bf16 autocast runs more steps per second than fp32 (benchmarks/results/matrix.md, "Training in bf16
on this CPU");
on CPUs without bf16 units bf16 products are emulated and can be several times slower. :class:`FastestPrecision`
measures it once at start-up (:func:`~dspark_lightning.devices.cpu_bf16_faster` on a training-sized product) and
becomes bf16 autocast (fp32 weights and optimizer state, like ``bf16-mixed``) or plain fp32 (like ``32-true``)::

    trainer:
      precision: null   # the plugin decides
      plugins: [{class_path: dspark_lightning.lightning.precision.FastestPrecision}]

The drafter's precision never affects losslessness: the target verifies every draft.
"""

from __future__ import annotations

import contextlib
import logging

import torch
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.utilities import GradClipAlgorithmType

from ..checks import UsageError
from ..devices import cpu_bf16_faster

log = logging.getLogger(__name__)


class FastestPrecision(MixedPrecision):
    """bf16 autocast where it is faster here (always on CUDA; on a CPU when a (rows, width) x (width, vocab) bf16
    product takes < 80 % of the fp32 time), else fp32. ``precision`` reads ``bf16-mixed`` or ``32-true``
    accordingly, so everything that reads ``trainer.precision`` sees what runs."""

    def __init__(self, width: int = 576, vocab: int = 8192, rows: int = 512, device: str | None = None) -> None:
        device = _device_type(device)
        self.bf16 = device != "cpu" or cpu_bf16_faster(width, vocab, m=rows)
        super().__init__("bf16-mixed", device)
        self.precision = "bf16-mixed" if self.bf16 else "32-true"
        print(
            f"[dspark-lightning] training precision: {self.precision} (the faster here; FastestPrecision)", flush=True
        )

    def forward_context(self):
        return super().forward_context() if self.bf16 else contextlib.nullcontext()

    def clip_gradients(self, optimizer, clip_val=0.0, gradient_clip_algorithm=GradClipAlgorithmType.NORM) -> None:
        """No gradient scaler here (bf16 and fp32 need none), so nothing is unscaled inside ``step()``: clipping is
        the plain one for every optimizer, fused AdamW included (which ``MixedPrecision`` refuses)."""
        Precision.clip_gradients(self, optimizer, clip_val, gradient_clip_algorithm)


def _device_type(device: str | None) -> str:
    """``cpu`` or ``cuda`` (``auto``/None: CUDA when available); a plugin may be configured for CUDA on a machine
    without it (a GPU recipe read elsewhere), any other device type is refused in one line."""
    if device is None or device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError):
        kind = None
    if kind not in ("cpu", "cuda"):
        raise UsageError(f"FastestPrecision: device {device!r} is not supported (use auto, cpu or cuda)")
    return kind
