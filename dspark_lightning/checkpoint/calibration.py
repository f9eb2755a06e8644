"""The STS calibration files beside a drafter's weights: one ``calibration_T<T>.json`` per serving temperature,
written whole, read back when the drafter is loaded, and the temperatures chosen for a sampling temperature at
decode time. What a file holds is fitted by :mod:`dspark_lightning.calibration`."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

from ..atomic import atomic_write


def _number(t: object) -> bool:
    return isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t)


def check_temperatures(temps: object, where: str) -> None:
    """Temperatures divide the logits: only finite positive numbers are meaningful (NaN turns every score NaN)."""
    if not (isinstance(temps, list | tuple) and temps and all(_number(t) and t > 0 for t in temps)):
        raise ValueError(f"{where}: temperatures must be a non-empty list of finite numbers > 0, got {temps!r}")


def calibration_file(temperature: float) -> str:
    """One STS file per serving temperature (docs/algorithm.md §5)."""
    return f"calibration_T{float(temperature):g}.json"


def write_calibration(drafter_dir: str | Path, doc: dict[str, Any]) -> Path:
    """Write ``doc`` (its ``temperatures`` and ``sampling_temperature`` at least) as the drafter's calibration file
    for that sampling temperature. Replaced atomically: a full disk or a kill leaves the previous calibration whole."""
    path = Path(drafter_dir) / calibration_file(doc["sampling_temperature"])
    check_temperatures(doc.get("temperatures"), f"refusing to write {path}")
    atomic_write(path, json.dumps(doc, indent=1) + "\n")
    return path


def load_calibrations(drafter_dir: str | Path, weights_sha256: str) -> dict[float, list[float]]:
    """{sampling temperature: STS temperatures} of every calibration file whose weights hash matches."""
    out = {}
    for f in sorted(Path(drafter_dir).glob("calibration_T*.json")):
        try:
            doc = json.loads(f.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ValueError(f"calibration file {f} is not readable JSON ({exc}); recalibrate or remove it") from None
        if not isinstance(doc, dict):
            raise ValueError(f"calibration file {f} is not a JSON object (it holds a {type(doc).__name__}); "
                             "recalibrate or remove it")  # fmt: skip
        if doc.get("weights_sha256") != weights_sha256:
            warnings.warn(f"{f} was fitted for other weights; ignoring it", stacklevel=2)
            continue
        temps, sampling = doc.get("temperatures"), doc.get("sampling_temperature")
        check_temperatures(temps, f"calibration file {f}")
        if not (_number(sampling) and sampling >= 0):
            raise ValueError(f"calibration file {f}: sampling_temperature must be a finite number >= 0, got {sampling}")
        out[float(sampling)] = [float(t) for t in temps]
    return out


def temperatures_for(drafter: Any, sampling_temperature: float) -> list[float] | None:
    """The STS temperatures for this serving temperature (first γ entries), or the drafter's fixed ones, or None."""
    cals = getattr(drafter, "calibrations", None) or {}
    g = getattr(drafter, "block_size", None)
    for T, temps in cals.items():
        if abs(T - float(sampling_temperature)) < 1e-6:
            return temps[:g]
    if cals:
        warnings.warn(
            f"no STS calibration for T = {sampling_temperature:g} (have {sorted(cals)}); using raw confidences",
            stacklevel=3,
        )
    return getattr(drafter, "conf_temperatures", None)
