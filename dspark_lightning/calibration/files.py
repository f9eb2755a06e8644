"""What calibration writes and reads: the calibration file of a fit (through
:func:`dspark_lightning.checkpoint.calibration.write_calibration`, beside the weights) and saved rollouts."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from ..checkpoint.calibration import ConfidenceMap, write_calibration
from ..checks import UsageError, input_file
from .confidence import ConfidenceRow
from .rollouts import Rollouts
from .sts import N_BINS, PositionReport, STSResult


def save_calibration(
    drafter_dir: str | Path,
    res: STSResult | None,
    *,
    temperature: float,
    dataset: dict,
    weights_sha256: str,
    heldout: tuple[list[PositionReport], list[PositionReport]] | None = None,
    confidence: ConfidenceMap | None = None,
    methods: list[str] | None = None,
    confidence_report: list[ConfidenceRow] | None = None,
    frontier: list[dict] | None = None,
    acceptance: str | None = None,
) -> Path:
    """Write ``calibration_T<T>.json`` next to the weights: the STS fit ``res`` (None for a drafter without a head),
    ``heldout`` = its (raw, STS) reports on unseen prompts, and the chosen ``confidence`` map with the candidate each
    position took and its held-out report, and the ``frontier`` of static and threshold policies replayed on those
    rounds (:func:`~.confidence.frontier`); ``acceptance``: the mode the rounds were decoded under, when not rejection
    sampling (its own file). The file is replaced atomically: a full disk or a kill leaves the previous
    calibration whole."""
    doc = {
        "temperatures": None if res is None else res.temperatures,
        "sampling_temperature": float(temperature),
        "bins": N_BINS,
        "dataset": dataset,
        "weights_sha256": weights_sha256,
    }
    if acceptance is not None:
        doc["acceptance"] = acceptance
    if res is not None:
        doc |= {
            "grid": {"min": min(res.grid), "max": max(res.grid), "size": len(res.grid)},
            "rows_per_position": [r.rows for r in res.after],
            "copied_positions": res.copied,
            "before": [asdict(r) for r in res.before],
            "after": [asdict(r) for r in res.after],
        }
    if heldout is not None:
        doc["heldout"] = {"before": [asdict(r) for r in heldout[0]], "after": [asdict(r) for r in heldout[1]]}
    if confidence is not None:
        doc["confidence"] = confidence.to_dict()
        doc["confidence_methods"] = methods
    if confidence_report is not None:
        doc["confidence_report"] = [asdict(r) for r in confidence_report]
    if frontier is not None:
        doc["frontier"] = frontier
    return write_calibration(drafter_dir, doc)


def load_rollouts(path: str | Path, flag: str = "--rollouts") -> Rollouts:
    """A ``rollouts.pt`` saved by an earlier calibration with a report folder (tensors only, never unpickled
    objects); anything else is refused naming ``flag``."""
    input_file(flag, path)
    try:
        return Rollouts.load(path)
    except Exception as exc:  # noqa: BLE001 - torch.load / the dataclass reject a foreign file in many ways
        msg = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise UsageError(f"{flag} {path} is not a saved rollouts file ({type(exc).__name__}: {msg})") from None
