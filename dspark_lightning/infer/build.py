"""An :class:`~.engine.Engine` wired to a drafter: its proposer (from the registry) and its STS temperatures.

What ``decode()`` drives, the closed-loop serving benchmark drives directly, and the drafter-cost profile
(:mod:`dspark_lightning.infer.profiling.measure_draft_cost`) runs, without reaching back into ``decode()`` and the
loading of exports.
"""

from __future__ import annotations

import warnings
from typing import Any

from ..checkpoint.calibration import confidence_for
from .acceptance.sampling import SamplingParams
from .engine import Engine
from .hardware import HardwareProfile
from .propose.draft import make_proposer


def make_engine(target, drafter, params: SamplingParams, *, scheduler: Any = "static", seed: int = 0,
                stop_token_ids: list[int] | None = None, stop: list[str] | None = None, batching: str = "padded",
                calibrated: bool = True, verifier: Any = "auto", acceptance: Any = "rejection",
                hardware: HardwareProfile | None = None) -> Engine:  # fmt: skip
    """The engine ``decode()`` drives (also driven directly by the closed-loop serving benchmark)."""
    temps, fitted_on = (None, "rejection")
    if calibrated and drafter is not None:
        temps, fitted_on = confidence_for(drafter, params.temperature, acceptance)
    proposer = make_proposer(drafter, batching=batching, confidence=temps) if drafter is not None else None
    engine = Engine(
        target,
        proposer,
        params=params,
        scheduler=scheduler,
        stop_token_ids=target.stop_token_ids if stop_token_ids is None else stop_token_ids,
        stop_strings=stop,
        seed=seed,
        batching=batching,
        verifier=verifier,
        acceptance=acceptance,
        hardware=hardware,
        confidence_mode=fitted_on,
    )
    if (temps is None and params.temperature > 0 and getattr(drafter, "conf_head", None) is not None
            and "sps" in engine.scheduler.reads_hardware):  # fmt: skip
        # docs/algorithm.md §5: the hardware-aware schedulers read absolute confidences; raw heads are overconfident
        # at T > 0. At T = 0 greedy drafts survive more often than the head's training law says, and the draft gate
        # bounds what a misjudged budget costs: raw confidences are the documented default there
        # (docs/inference.md, "Calibration")
        warnings.warn(
            f"{type(engine.scheduler).__name__} is driven by uncalibrated confidences (no STS file for "
            f"T = {params.temperature:g}{'' if calibrated else ', or calibrated=False'}); run `dspark-lightning "
            "calibrate` on this drafter for calibrated verification budgets",
            stacklevel=3,
        )
    return engine
