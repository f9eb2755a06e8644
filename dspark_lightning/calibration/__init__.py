"""Confidence calibration (Sequential Temperature Scaling, docs/algorithm.md §5): everything from rollouts to the
file beside the drafter's weights.

- sts.py: the maths (STS fit, ECE / AUROC / Brier, survival probabilities), tensors in and numbers out;
- rollouts.py: the rows it is fitted on, from real speculative decoding on the STS prompt pool;
- files.py: the calibration file a fit writes (through :mod:`dspark_lightning.checkpoint.calibration`, which also
  reads it back when a drafter is loaded) and saved rollouts;
- report.py: the per-position table and reliability diagrams;
- api.py: :func:`calibrate`, what the ``calibrate`` command and ``fit --calibrate`` call.
"""

from __future__ import annotations

from .api import DOMAINS, calibrate, check_calibrate_args
from .files import load_rollouts, save_calibration
from .report import calibration_markdown, plot_reliability
from .rollouts import Rollouts, calibration_prompts, heldout_prompts, rollouts
from .sts import (
    MIN_CLASS,
    MIN_ROWS,
    N_BINS,
    PositionReport,
    STSResult,
    auroc,
    brier,
    default_grid,
    ece,
    ece_floor,
    fit_sts,
    position_reports,
    reported_ece,
    survival_probs,
)

__all__ = [
    "DOMAINS",
    "MIN_CLASS",
    "MIN_ROWS",
    "N_BINS",
    "PositionReport",
    "Rollouts",
    "STSResult",
    "auroc",
    "brier",
    "calibrate",
    "calibration_markdown",
    "calibration_prompts",
    "check_calibrate_args",
    "default_grid",
    "ece",
    "ece_floor",
    "fit_sts",
    "heldout_prompts",
    "load_rollouts",
    "plot_reliability",
    "position_reports",
    "reported_ece",
    "rollouts",
    "save_calibration",
    "survival_probs",
]
