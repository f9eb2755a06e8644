"""Sequential Temperature Scaling (STS, docs/algorithm.md §5) and the calibration metrics of docs/algorithm.md §2.

Tensors in, numbers out. The rows come from :mod:`.rollouts` (real decoding on held-out prompts); the file the fit
is written to is :mod:`dspark_lightning.checkpoint.calibration`'s.

Rows are decoding rounds with full-length verification (ℓ = γ, or shorter after an accepted stop):
raw confidence logits z (N, γ), accepted drafts m (N,), effective lengths ℓ (N,). Position k is
scored on rows with ℓ ≥ k against y = 1[m ≥ k] with the *survival* p_k = Π_{j≤k} σ(z_j / T_j).
STS fits T_1, T_2, ... left to right by grid search of the 20-bin ECE, earlier positions frozen.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import torch

from ..checkpoint.calibration import check_temperatures
from ..checks import UsageError

N_BINS = 20
MIN_ROWS = 200  # docs/algorithm.md §5
MIN_CLASS = 10  # our guard: fewer surviving (or failing) rounds than this at a position copies the previous T
EPS = 1e-8


def default_grid() -> torch.Tensor:
    """400 log-spaced temperatures in [0.05, 20] plus 1.0, sorted (docs/algorithm.md §5)."""
    g = torch.logspace(math.log10(0.05), math.log10(20.0), 400, dtype=torch.float64)
    return torch.sort(torch.cat([g, torch.ones(1, dtype=torch.float64)])).values


def ece(p: torch.Tensor, y: torch.Tensor, n_bins: int = N_BINS) -> float:
    """Σ_b (N_b/N)·|mean_b p − mean_b y| with b = min(⌊n_bins·p⌋, n_bins − 1).

    The binning of torchmetrics' ``binary_calibration_error`` (tested equal), in one bincount: the STS grid
    search calls it 401 times per position. Reports use torchmetrics itself (:func:`position_reports`).
    """
    p, y = p.double().clamp(EPS, 1 - EPS), y.double()
    if p.numel() == 0:
        return float("nan")
    b = (p * n_bins).floor().long().clamp(max=n_bins - 1)
    sp = torch.bincount(b, weights=p, minlength=n_bins)
    sy = torch.bincount(b, weights=y, minlength=n_bins)
    return float((sp - sy).abs().sum() / p.numel())


def auroc(p: torch.Tensor, y: torch.Tensor) -> float:
    """torchmetrics' binary AUROC (ties count ½); nan when one class is absent."""
    from torchmetrics.functional.classification import binary_auroc

    y = y.long()
    if p.numel() == 0 or bool((y == y[0]).all()):
        return float("nan")
    return float(binary_auroc(p.double(), y, validate_args=False))


def brier(p: torch.Tensor, y: torch.Tensor) -> float:
    """Mean squared error of the probabilities (torchmetrics has no binary Brier score by that name)."""
    from torchmetrics.functional import mean_squared_error

    return float(mean_squared_error(p.double(), y.double())) if p.numel() else float("nan")


def reported_ece(p: torch.Tensor, y: torch.Tensor, n_bins: int = N_BINS) -> float:
    """torchmetrics' 20-bin L1 calibration error (the same number as :func:`ece`)."""
    from torchmetrics.functional.classification import binary_calibration_error

    if p.numel() == 0:
        return float("nan")
    p = p.double().clamp(EPS, 1 - EPS)
    return float(binary_calibration_error(p, y.long(), n_bins=n_bins, norm="l1", validate_args=False))


def ece_floor(p: torch.Tensor, n_bins: int = N_BINS, draws: int = 200, seed: int = 0) -> float:
    """The ECE a *perfectly calibrated* predictor with these scores would show on this many rows: the mean ECE
    against y ~ Bernoulli(p) over Monte-Carlo draws. ECE is biased upwards on finite samples; below this floor a
    measured ECE says nothing more."""
    if p.numel() == 0:
        return float("nan")
    g = torch.Generator().manual_seed(seed)
    p = p.double().clamp(EPS, 1 - EPS)
    return (
        sum(ece(p, (torch.rand(p.shape, generator=g, dtype=torch.float64) < p).double(), n_bins) for _ in range(draws))
        / draws
    )


def survival_probs(z: torch.Tensor, temps: torch.Tensor) -> torch.Tensor:
    """p_k = Π_{j≤k} σ(z_j / T_j), clamped to [1e-8, 1 − 1e-8]: (N, γ)."""
    c = torch.sigmoid(z.double() / temps.double())
    return torch.cumprod(c, -1).clamp(EPS, 1 - EPS)


@dataclass
class PositionReport:
    k: int
    rows: int
    mean_p: float
    mean_y: float
    ece: float
    auroc: float
    brier: float
    ece_floor: float = float("nan")  # expected ECE of a perfectly calibrated predictor on these rows


def position_reports(z, m, ell, temps) -> list[PositionReport]:
    """Per-position calibration metrics of the survival probabilities under ``temps``."""
    p = survival_probs(z, temps)
    out = []
    for k in range(1, z.shape[1] + 1):
        rows = ell >= k
        pk, yk = p[rows, k - 1], (m[rows] >= k).double()
        out.append(
            PositionReport(
                k,
                int(rows.sum()),
                float(pk.mean()) if pk.numel() else float("nan"),
                float(yk.mean()) if yk.numel() else float("nan"),
                reported_ece(pk, yk),
                auroc(pk, yk),
                brier(pk, yk),
                ece_floor(pk),
            )
        )
    return out


@dataclass
class STSResult:
    temperatures: list[float]
    before: list[PositionReport]
    after: list[PositionReport]
    grid: list[float] = field(repr=False)
    copied: list[int] = field(default_factory=list)  # positions with too few rows (temperature copied)


def fit_sts(
    z: torch.Tensor,  # (N, γ) raw confidence logits
    m: torch.Tensor,  # (N,) accepted drafts
    ell: torch.Tensor,  # (N,) effective verified lengths
    grid: torch.Tensor | None = None,
    min_rows: int = MIN_ROWS,
    min_class: int = MIN_CLASS,
) -> STSResult:
    """T*_k = argmin_T ECE_k(G_{k−1}·σ(z_k/T)), ties broken by the smallest |log T|, left to right."""
    grid = default_grid() if grid is None else grid.double()
    z, m, ell = z.double(), m.long(), ell.long()
    if not bool(torch.isfinite(z).all()):
        raise UsageError("STS: the confidence logits hold NaN or inf (non-finite drafter weights?); nothing to fit")
    check_temperatures(grid.tolist(), "STS grid")
    g = z.shape[1]
    temps = torch.ones(g, dtype=torch.float64)
    prefix = torch.ones(z.shape[0], dtype=torch.float64)  # G_{i,k-1}
    copied = []
    closeness = grid.log().abs()
    for k in range(g):
        rows = ell >= k + 1
        y = (m[rows] >= k + 1).double()
        # too few rows, or (almost) one class only (with no positive every T scores ECE = mean p, which only pushes
        # T to the grid's edge; with a handful the argmin fits noise): keep the previous position's temperature
        n_pos = int(y.sum())
        if int(rows.sum()) < min_rows or min(n_pos, y.numel() - n_pos) < min_class:
            temps[k] = temps[k - 1] if k > 0 else 1.0
            copied.append(k + 1)
        else:
            pre, zk = prefix[rows], z[rows, k]
            errs = torch.tensor([ece(pre * torch.sigmoid(zk / T), y) for T in grid], dtype=torch.float64)
            best = errs.min()
            ties = (errs <= best + 1e-12).nonzero().flatten()
            temps[k] = grid[ties[closeness[ties].argmin()]]
        prefix = prefix * torch.sigmoid(z[:, k] / temps[k])
    check_temperatures(temps.tolist(), "STS result")
    if copied:
        msg = (
            f"STS: fewer than {min_rows} rows or than {min_class} rounds of a class at positions {copied}; "
            "copied the previous temperature"
        )
        warnings.warn(msg, stacklevel=2)
    return STSResult(
        temperatures=temps.tolist(),
        before=position_reports(z, m, ell, torch.ones(g, dtype=torch.float64)),
        after=position_reports(z, m, ell, temps),
        grid=grid.tolist(),
        copied=copied,
    )
