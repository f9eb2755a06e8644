"""The STS calibration files beside a drafter's weights: one ``calibration_T<T>.json`` per serving temperature,
written whole, read back when the drafter is loaded, and the temperatures chosen for a sampling temperature at
decode time. What a file holds is fitted by :mod:`dspark_lightning.calibration`."""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..atomic import atomic_write
from ..checks import UsageError


def _number(t: object) -> bool:
    return isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t)


def check_temperatures(temps: object, where: str) -> None:
    """Temperatures divide the logits: only finite positive numbers are meaningful (NaN turns every score NaN)."""
    if not (isinstance(temps, list | tuple) and temps and all(_number(t) and t > 0 for t in temps)):
        raise UsageError(f"{where}: temperatures must be a non-empty list of finite numbers > 0, got {temps!r}")


REJECTION = "rejection"


def calibration_file(temperature: float, acceptance: str = REJECTION) -> str:
    """One file per serving temperature (docs/algorithm.md §5) and acceptance mode: ``calibration_T<T>.json`` for
    rejection sampling, ``calibration_T<T>_<mode>.json`` for maps fitted on another mode's rounds."""
    mode = "" if acceptance == REJECTION else f"_{acceptance}"
    return f"calibration_T{float(temperature):g}{mode}.json"


def write_calibration(drafter_dir: str | Path, doc: dict[str, Any]) -> Path:
    """Write ``doc`` (its ``temperatures`` and ``sampling_temperature`` at least, its ``acceptance`` mode when not
    rejection sampling) as the drafter's calibration file for that sampling temperature and mode. Replaced
    atomically: a full disk or a kill leaves the previous calibration whole."""
    path = Path(drafter_dir) / calibration_file(doc["sampling_temperature"], doc.get("acceptance", REJECTION))
    if doc.get("temperatures") is not None or "confidence" not in doc:
        check_temperatures(doc.get("temperatures"), f"refusing to write {path}")
    if "confidence" in doc:
        ConfidenceMap.from_dict(doc["confidence"])  # refuses a malformed map before anything is written
    atomic_write(path, json.dumps(doc, indent=1) + "\n")
    return path


def read_calibration_doc(f: str | Path) -> dict[str, Any]:
    """The JSON object of a calibration file beside a drafter's weights (ours, ``calibration_T<T>.json``, or a serving
    layout's side file): one :class:`~dspark_lightning.checks.UsageError` naming the file for one that is not
    readable JSON or holds something else than an object (a list, a number)."""
    try:
        doc = json.loads(Path(f).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"calibration file {f} is not readable JSON ({exc}); recalibrate or remove it") from exc
    if not isinstance(doc, dict):
        raise UsageError(f"calibration file {f} is not a JSON object (it holds a {type(doc).__name__}); "
                         "recalibrate or remove it")  # fmt: skip
    return doc


def sts_temperatures_of(doc: dict[str, Any], f: str | Path, key: str = "sts_temperatures") -> dict[float, list[float]]:
    """``{sampling temperature: STS temperatures}`` of a side file's ``key`` (``{"1": [T_1, ..., T_γ], ...}``), each
    list checked by :func:`check_temperatures`; one error naming the file and the field otherwise."""
    table = doc.get(key)
    if not isinstance(table, dict):
        raise UsageError(f"calibration file {f}: {key} must be an object {{sampling temperature: [temperatures]}}, "
                         f"got {type(table).__name__}")  # fmt: skip
    out = {}
    for T, temps in table.items():
        try:
            sampling = float(T)
        except ValueError as exc:
            raise UsageError(f"calibration file {f}: {key} key {T!r} is not a sampling temperature") from exc
        check_temperatures(temps, f"calibration file {f}: {key}[{T!r}]")
        out[sampling] = [float(t) for t in temps]
    return out


def _calibration_docs(drafter_dir: str | Path, weights_sha256: str) -> dict[tuple[float, str], dict[str, Any]]:
    """{(sampling temperature, acceptance mode): checked calibration file} of every file whose weights hash
    matches."""
    out = {}
    for f in sorted(Path(drafter_dir).glob("calibration_T*.json")):
        doc = read_calibration_doc(f)
        if doc.get("weights_sha256") != weights_sha256:
            warnings.warn(f"{f} was fitted for other weights; ignoring it", stacklevel=3)
            continue
        temps, sampling = doc.get("temperatures"), doc.get("sampling_temperature")
        if temps is not None or "confidence" not in doc:  # a drafter without a head has a map, no STS
            check_temperatures(temps, f"calibration file {f}")
        if not (_number(sampling) and sampling >= 0):
            raise UsageError(f"calibration file {f}: sampling_temperature must be a finite number >= 0, got {sampling}")
        mode = doc.get("acceptance", REJECTION)
        if not (isinstance(mode, str) and mode):
            raise UsageError(f"calibration file {f}: acceptance must name an acceptance mode, got {mode!r}")
        out[float(sampling), mode] = {**doc, "_path": str(f)}
    return out


def load_calibrations(drafter_dir: str | Path, weights_sha256: str) -> dict[float, list[float]]:
    """{sampling temperature: STS temperatures} of every rejection-sampling calibration file whose weights hash
    matches (what the serving layouts export)."""
    docs = _calibration_docs(drafter_dir, weights_sha256)
    return {T: [float(t) for t in doc["temperatures"]] for (T, mode), doc in docs.items()
            if mode == REJECTION and doc.get("temperatures")}  # fmt: skip


@dataclass(frozen=True)
class ConfidenceMap:
    """Per-position map from what a drafter computes before drawing x_k to the conditional confidence ĉ_k:

        ĉ_k = σ(head_k · z_k + margin_k · μ_k + bias_k)

    z_k is the confidence head's logit, μ_k the draft's top-2 logit margin at position k (both known before x_k is
    sampled, so any such map keeps verification lossless). STS is ``head = 1/T, margin = bias = 0``; an affine (Platt)
    fit of the head sets ``head`` and ``bias``; vLLM's free estimator for drafters without a head sets ``margin`` and
    ``bias`` only. :mod:`dspark_lightning.calibration` fits them; ``calibration_T<T>.json`` holds the chosen one."""

    head: tuple[float, ...]
    margin: tuple[float, ...]
    bias: tuple[float, ...]

    def __post_init__(self) -> None:
        lists = (self.head, self.margin, self.bias)
        if not all(isinstance(v, list | tuple) for v in lists) or len({len(v) for v in lists}) != 1 or not self.head:
            raise UsageError(f"a confidence map needs three equal-length lists (head, margin, bias), got {lists}")
        if not all(_number(x) for v in lists for x in v):
            raise UsageError(f"a confidence map holds finite numbers only, got {lists}")

    @classmethod
    def sts(cls, temperatures: list[float]) -> ConfidenceMap:
        check_temperatures(temperatures, "STS map")
        n = len(temperatures)
        return cls(tuple(1.0 / float(t) for t in temperatures), (0.0,) * n, (0.0,) * n)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> ConfidenceMap:
        return cls(*(tuple(doc[k]) for k in ("head", "margin", "bias")))

    def to_dict(self) -> dict[str, list[float]]:
        return {"head": list(self.head), "margin": list(self.margin), "bias": list(self.bias)}

    def __len__(self) -> int:
        return len(self.head)

    @property
    def reads_head(self) -> bool:
        return any(h != 0 for h in self.head)

    @property
    def reads_margin(self) -> bool:
        return any(m != 0 for m in self.margin)

    def logit(self, k: int, z: torch.Tensor | None, margin: torch.Tensor | None) -> torch.Tensor:
        """The logit of ĉ_k (0-based k) from the head logits ``z`` and margins ``margin`` (R,) of position k."""
        ref = z if z is not None else margin
        out = torch.full_like(ref, self.bias[k], dtype=torch.float32)
        if self.head[k]:
            out = out + self.head[k] * z.float()
        if self.margin[k]:
            out = out + self.margin[k] * margin.float()
        return out

    def first(self, n: int) -> ConfidenceMap:
        """The map of a block of the first ``n`` positions."""
        if n > len(self):
            raise UsageError(f"a confidence map of {len(self)} positions cannot serve a block of {n}")
        return ConfidenceMap(self.head[:n], self.margin[:n], self.bias[:n])


def load_confidence_maps(drafter_dir: str | Path, weights_sha256: str) -> dict[tuple[float, str], ConfidenceMap]:
    """{(sampling temperature, acceptance mode): chosen confidence map} of the calibration files whose weights hash
    matches: the file's ``confidence`` map where it has one, else its STS temperatures."""
    out = {}
    for key, doc in _calibration_docs(drafter_dir, weights_sha256).items():
        try:
            cmap = doc.get("confidence")
            out[key] = ConfidenceMap.from_dict(cmap) if cmap is not None else ConfidenceMap.sts(doc["temperatures"])
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"calibration file {doc['_path']}: bad confidence map ({exc}); recalibrate or remove "
                             "it") from exc  # fmt: skip
    return out


def confidence_for(drafter: Any, sampling_temperature: float,
                   acceptance: Any = REJECTION) -> tuple[ConfidenceMap | None, str]:  # fmt: skip
    """The confidence map for this serving temperature (first γ positions) and the acceptance mode whose rounds it
    was fitted on: the drafter's calibration for this temperature under ``acceptance`` (a mode's name) where one
    exists, else its rejection-sampling calibration (its chosen map, or the STS temperatures of a file without one),
    else (None, rejection): raw confidences."""
    maps = getattr(drafter, "confidence_maps", None) or {
        (T, REJECTION): ConfidenceMap.sts(temps) for T, temps in (getattr(drafter, "calibrations", None) or {}).items()
    }
    g = getattr(drafter, "block_size", None)
    modes = [acceptance, REJECTION] if isinstance(acceptance, str) and acceptance != REJECTION else [REJECTION]
    for mode in modes:
        for (T, m), cmap in maps.items():
            if m == mode and abs(T - float(sampling_temperature)) < 1e-6:
                return (cmap.first(g) if g is not None else cmap), mode
    if maps:
        have = sorted({T for T, _ in maps})
        warnings.warn(f"no calibration for T = {sampling_temperature:g} (have {have}); using raw confidences",
                      stacklevel=3)  # fmt: skip
    return None, REJECTION
