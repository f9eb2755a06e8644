"""What a fit does around the training step, as Lightning Callbacks (``DSparkModule.configure_callbacks`` adds one
of each the Trainer lacks, so a plain ``Trainer.fit(module, datamodule)`` trains, checks and exports as
``dspark-lightning fit`` does; pass your own instance to configure one, e.g. ``DrafterExport(dir=...)``).

- :class:`DivergenceGuard`: stops at a non-finite loss or gradient before it reaches the weights.
- :class:`MoELogging`: logs the expert loads of MoE backbones.
- :class:`BudgetProgressBar`: the training bar, counting against a time limit when that is the budget.
- :class:`FitStats`: writes fit_stats.json (wall time, throughput, peak RSS, the last validation).
- :class:`DrafterExport`: exports the drafter after fit (and STS-calibrates it on request).
"""

from __future__ import annotations

from .divergence import DivergenceGuard, TrainingDiverged
from .export import Calibration, DrafterExport, full_drafter_state
from .fit_stats import FIT_STATS, FitStats, validate_if_stale
from .moe import MoELogging
from .progress import BudgetProgressBar

__all__ = [
    "FIT_STATS",
    "BudgetProgressBar",
    "Calibration",
    "DivergenceGuard",
    "DrafterExport",
    "FitStats",
    "MoELogging",
    "TrainingDiverged",
    "default_callbacks",
    "full_drafter_state",
    "validate_if_stale",
]


def default_callbacks() -> list:
    """One of each, in the order their ``on_fit_end`` must run (the statistics' final validation, then the export)."""
    return [DivergenceGuard(), MoELogging(), FitStats(), DrafterExport()]
