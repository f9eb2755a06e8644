"""Confidence maps fitted on rollouts, and the choice among them (docs/algorithm.md §5; the map itself is
:class:`~dspark_lightning.checkpoint.calibration.ConfidenceMap`).

Candidates, each per position k over the rounds that reached k (ℓ ≥ k, m ≥ k − 1) with the label 1[m ≥ k]:

- ``sts``: the paper's STS temperatures (:func:`.sts.fit_sts`), ĉ_k = σ(z_k / T_k);
- ``platt``: an affine map of the head's logit, σ(a_k z_k + b_k) (maximum likelihood);
- ``margin``: vLLM's free estimator for drafters without a head, σ(a_k μ_k + b_k) on the draft's top-2 logit margin;
- ``head+margin``: both inputs, σ(a_k z_k + c_k μ_k + b_k).

Each position takes the candidate with the lowest Brier score on prompts its fit did not see (two folds of the fit
prompts). Brier, not ECE, decides: ECE alone is minimised by a constant at the base rate, which ranks nothing;
Brier is calibration plus sharpness. ECE is reported beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..checkpoint.calibration import ConfidenceMap
from ..checks import UsageError
from .sts import EPS, auroc, brier, ece_floor, fit_sts, reported_ece

CANDIDATES = ("sts", "platt", "margin", "head+margin")
HEAD_FREE = ("margin",)  # the candidates a drafter without a confidence head can use


@dataclass
class Rows:
    """Full-length rollout rounds: head logits z (N, γ) or None, draft margins mu (N, γ), accepted m (N,),
    effective lengths ell (N,)."""

    z: torch.Tensor | None
    mu: torch.Tensor
    m: torch.Tensor
    ell: torch.Tensor

    def take(self, mask: torch.Tensor) -> Rows:
        return Rows(None if self.z is None else self.z[mask], self.mu[mask], self.m[mask], self.ell[mask])

    @property
    def width(self) -> int:
        return int(self.mu.shape[1])


def logistic(x: torch.Tensor, y: torch.Tensor, l2: float = 1e-4, iters: int = 60) -> torch.Tensor:
    """Maximum-likelihood logistic regression by Newton's method: weights (F,) then bias, for features x (N, F)."""
    X = torch.cat([x.double(), torch.ones(len(x), 1, dtype=torch.float64)], 1)
    y = y.double()
    w = torch.zeros(X.shape[1], dtype=torch.float64)
    reg = l2 * torch.eye(X.shape[1], dtype=torch.float64)
    reg[-1, -1] = 0.0
    for _ in range(iters):
        p = torch.sigmoid(X @ w)
        grad = X.T @ (p - y) + reg @ w
        hess = (X * (p * (1 - p))[:, None]).T @ X + reg + 1e-9 * torch.eye(X.shape[1], dtype=torch.float64)
        step = torch.linalg.solve(hess, grad)
        w = w - step
        if float(step.abs().max()) < 1e-10:
            break
    return w


def _reached(rows: Rows, k: int) -> torch.Tensor:
    return (rows.ell >= k + 1) & (rows.m >= k)


def fit_map(kind: str, rows: Rows, min_rows: int = 50, min_class: int = 5) -> ConfidenceMap:
    """The ``kind`` candidate fitted on ``rows``; a position with too few rounds (or of one class) keeps the
    previous position's coefficients (the identity map of the head, or a zero margin weight, at k = 1)."""
    g = rows.width
    if kind == "sts":
        if rows.z is None:
            raise UsageError("STS scales a confidence head's logits; this drafter has none")
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # copied positions are expected on small pools; the report shows rows
            return ConfidenceMap.sts(fit_sts(rows.z, rows.m, rows.ell).temperatures)
    uses_head, uses_margin = kind in ("platt", "head+margin"), kind in ("margin", "head+margin")
    if uses_head and rows.z is None:
        raise UsageError(f"the {kind!r} confidence map reads a confidence head this drafter does not have")
    head, margin, bias = [], [], []
    prev = (1.0 if uses_head else 0.0, 0.0, 0.0)
    for k in range(g):
        sel = _reached(rows, k)
        y = (rows.m[sel] >= k + 1).double()
        pos = int(y.sum())
        if int(sel.sum()) < min_rows or min(pos, y.numel() - pos) < min_class:
            coef = prev
        else:
            feats = [t[sel, k][:, None] for t, on in ((rows.z, uses_head), (rows.mu, uses_margin)) if on]
            w = logistic(torch.cat(feats, 1), y).tolist()
            coef = (w[0] if uses_head else 0.0, w[-2] if uses_margin else 0.0, w[-1])
        head.append(coef[0])
        margin.append(coef[1])
        bias.append(coef[2])
        prev = coef
    return ConfidenceMap(tuple(head), tuple(margin), tuple(bias))


def conditional(cmap: ConfidenceMap, rows: Rows) -> torch.Tensor:
    """ĉ (N, γ) of the map on the rows."""
    cols = [
        torch.sigmoid(cmap.logit(k, None if rows.z is None else rows.z[:, k], rows.mu[:, k]).double())
        for k in range(rows.width)
    ]
    return torch.stack(cols, 1)


def survival(cmap: ConfidenceMap | None, rows: Rows) -> torch.Tensor:
    """a_k = Π_{j≤k} ĉ_j (N, γ), clamped; ``cmap`` None: the raw head."""
    c = torch.sigmoid(rows.z.double()) if cmap is None else conditional(cmap, rows)
    return c.cumprod(-1).clamp(EPS, 1 - EPS)


def choose(rows: Rows, groups: torch.Tensor, kinds: tuple[str, ...] = CANDIDATES) -> tuple[ConfidenceMap, list[str]]:
    """Per position, the candidate with the lowest conditional Brier score out of fold: ``groups`` (N,) says which
    prompt each row comes from, and every other prompt (in the order of their ids) is one fold; fit on one fold,
    score on the other, both ways. The chosen coefficients are then refitted on all the rows."""
    g = rows.width
    if rows.z is None:
        kinds = tuple(k for k in kinds if k in HEAD_FREE)
    ids = torch.unique(groups, return_inverse=True)[1]
    folds = ids % 2 if len(ids) and int(ids.max()) > 0 else torch.arange(len(ids)) % 2  # one prompt: rows alternate
    scores = {kind: torch.zeros(g, dtype=torch.float64) for kind in kinds}
    for f in (0, 1):
        train, test = rows.take(folds != f), rows.take(folds == f)
        if not len(train.m) or not len(test.m):
            continue
        for kind in kinds:
            c = conditional(fit_map(kind, train), test)
            for k in range(g):
                sel = _reached(test, k)
                if bool(sel.any()):
                    y = (test.m[sel] >= k + 1).double()
                    scores[kind][k] += float(((c[sel, k] - y) ** 2).sum())
    full = {kind: fit_map(kind, rows) for kind in kinds}
    picked = [min(kinds, key=lambda kind: (float(scores[kind][k]), kinds.index(kind))) for k in range(g)]
    cols = [[getattr(full[picked[k]], part)[k] for k in range(g)] for part in ("head", "margin", "bias")]
    return ConfidenceMap(*(tuple(c) for c in cols)), picked


@dataclass
class ConfidenceRow:
    """One position's numbers (docs/evaluation.md, ``confidence.json``)."""

    position: int
    rows: int
    mean_y: float
    mean_p: float  # the chosen map's mean survival
    auroc_head: float  # the head, calibrated (STS): within a position the ranking of the raw head's survival
    auroc_margin: float  # vLLM's margin estimator
    auroc: float  # the chosen map
    ece_raw: float  # the raw head (the margin estimator's for a drafter without a head)
    ece_sts: float
    ece_calibrated: float  # the chosen map
    ece_floor: float  # what a perfectly calibrated predictor with the chosen scores shows on these rows
    brier_raw: float
    brier_calibrated: float
    calibration: str  # the chosen candidate


def report(rows: Rows, chosen: ConfidenceMap, picked: list[str], fit: Rows | None = None) -> list[ConfidenceRow]:
    """Per-position metrics on ``rows`` (held-out rounds) of the raw head, STS, the margin estimator and the chosen
    map; the STS and margin comparators are fitted on ``fit`` (default: ``rows`` themselves)."""
    fit = rows if fit is None else fit
    has_head = rows.z is not None
    p_chosen = survival(chosen, rows)
    p_margin = survival(fit_map("margin", fit), rows)
    p_sts = survival(fit_map("sts", fit), rows) if has_head else p_margin
    p_raw = survival(None, rows) if has_head else p_margin
    out = []
    for k in range(rows.width):
        sel = rows.ell >= k + 1
        y = (rows.m[sel] >= k + 1).double()

        def at(p: torch.Tensor) -> torch.Tensor:
            return p[sel, k]  # noqa: B023 - used at once, inside this iteration

        out.append(
            ConfidenceRow(
                position=k + 1,
                rows=int(sel.sum()),
                mean_y=float(y.mean()) if y.numel() else float("nan"),
                mean_p=float(at(p_chosen).mean()) if y.numel() else float("nan"),
                auroc_head=auroc(at(p_sts), y) if has_head else float("nan"),
                auroc_margin=auroc(at(p_margin), y),
                auroc=auroc(at(p_chosen), y),
                ece_raw=reported_ece(at(p_raw), y),
                ece_sts=reported_ece(at(p_sts), y) if has_head else float("nan"),
                ece_calibrated=reported_ece(at(p_chosen), y),
                ece_floor=ece_floor(at(p_chosen)),
                brier_raw=brier(at(p_raw), y),
                brier_calibrated=brier(at(p_chosen), y),
                calibration=picked[k],
            )
        )
    return out


def report_markdown(rows: list[ConfidenceRow], title: str) -> str:
    """The per-position table ``calibrate`` and ``fit`` print."""

    def f(x: float, pct: bool = False) -> str:
        if x != x:
            return "—"
        return f"{100 * x:.1f} %" if pct else f"{x:.3f}"

    lines = [
        f"{title}",
        "",
        "| k | rows | mean y | mean p | AUROC head | AUROC margin | AUROC chosen | ECE raw | ECE STS | ECE chosen "
        "| floor | Brier raw → chosen | map |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.position} | {r.rows} | {f(r.mean_y)} | {f(r.mean_p)} | {f(r.auroc_head)} | {f(r.auroc_margin)} "
            f"| {f(r.auroc)} | {f(r.ece_raw, True)} | {f(r.ece_sts, True)} | {f(r.ece_calibrated, True)} "
            f"| {f(r.ece_floor, True)} | {f(r.brier_raw)} → {f(r.brier_calibrated)} | {r.calibration} |"
        )
    return "\n".join(lines)


def frontier(rows: Rows, cmap: ConfidenceMap | None, thresholds=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
             gammas=None) -> list[dict]:  # fmt: skip
    """Drafts verified per committed token against τ for static γ and for thresholds on the map's survival,
    replayed on full-length rollouts: a round verified to ℓ ≤ its recorded length accepts min(m, ℓ) (each position's
    acceptance test is the same draw whatever ℓ is), so every policy is scored on the same rounds. A threshold's
    points lie above the static ones (more τ for the same drafts) exactly when the confidences rank."""
    g = rows.width
    a = survival(cmap, rows)

    def point(policy: str, ell: torch.Tensor) -> dict:
        ell = torch.minimum(ell, rows.ell)
        committed = torch.minimum(rows.m, ell) + 1
        return {"policy": policy, "drafts_per_token": round(float(ell.sum() / committed.sum()), 4),
                "tau": round(float(committed.double().mean()), 4)}  # fmt: skip

    out = [point(f"static:{k}", torch.full_like(rows.m, k)) for k in (gammas or range(0, g + 1))]
    out += [point(f"threshold:{t:g}", (a >= t).long().cumprod(-1).sum(-1)) for t in thresholds]
    return out
