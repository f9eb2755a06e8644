"""Device and dtype arguments, parsed one way everywhere (CLI flags, recipes, Python calls).

``device``: ``"auto"``/None (CUDA when available, else CPU), ``"cpu"``, ``"cuda"``, ``"cuda:1"``, a torch.device.
``dtype``: ``"auto"``/None (bf16 on CUDA, fp32 on CPU, where bf16 products are often emulated and slower),
``"bf16"``/``"bfloat16"``, ``"fp16"``/``"float16"``/``"half"``, ``"fp32"``/``"float32"``, or a torch.dtype.
The sampling law, acceptance test and residual are always computed in fp32 or wider whatever these are.

A drafter's precision never affects losslessness, only its speed, so ``drafter_dtype="auto"`` picks what is
fastest where it runs (:func:`resolve_drafter_dtype`): bf16 on CUDA; on a CPU, bf16 only when a measured product
of the drafter's LM-head shape is faster than fp32 (CPUs with native bf16 matrix instructions: faster; without:
several times slower).
"""

from __future__ import annotations

import functools
import platform
import re
import time
from pathlib import Path

import torch

from .checks import UsageError

DTYPES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
    "float": torch.float32,
}


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """A torch.device; ``auto``/None picks CUDA when it is available. Refuses a CUDA device this machine lacks."""
    if device is None or (isinstance(device, str) and device == "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise UsageError(f"unknown device {device!r} (use auto, cpu, cuda or cuda:N)") from exc
    if dev.type not in ("cpu", "cuda"):
        raise UsageError(f"device {device!r} is not supported (use auto, cpu, cuda or cuda:N)")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"device {device!r} requested but CUDA is not available on this machine")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise UsageError(f"device {device!r} requested but this machine has {torch.cuda.device_count()} CUDA devices")
    return dev


def resolve_dtype(dtype: str | torch.dtype | None = "auto", device: str | torch.device | None = "auto") -> torch.dtype:
    """A floating torch.dtype; ``auto``/None = bf16 on CUDA, fp32 elsewhere."""
    if isinstance(dtype, torch.dtype):
        if not dtype.is_floating_point:
            raise UsageError(f"dtype must be a floating-point type, got {dtype}")
        return dtype
    if dtype is None or dtype == "auto":
        return torch.bfloat16 if resolve_device(device).type == "cuda" else torch.float32
    key = str(dtype).lower().removeprefix("torch.")
    if key not in DTYPES:
        raise UsageError(f"unknown dtype {dtype!r}; choose from auto, {', '.join(sorted(set(DTYPES)))}")
    return DTYPES[key]


def check_device_args(device: str, dtype: str, drafter_dtype: str | None = None) -> None:
    """A command's ``--device`` / ``--dtype`` / ``--drafter_dtype``: a device this machine has and dtypes that exist,
    checked before any model is loaded (ValueError naming the bad one)."""
    dev = resolve_device(device)
    resolve_dtype(dtype, dev)
    if drafter_dtype is not None:
        resolve_dtype(drafter_dtype, dev)


def param_dtype(module) -> torch.dtype | None:
    """The dtype of a module's first parameter (what a drafter runs in), None for parameter-free objects."""
    p = next(iter(module.parameters()), None) if isinstance(module, torch.nn.Module) else None
    return None if p is None else p.dtype


def dtype_name(dtype: torch.dtype) -> str:
    """The short name used in configs and tables (``bf16``, ``fp16``, ``fp32``)."""
    return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}.get(dtype, str(dtype))


BF16_MARGIN = 0.8  # bf16 is chosen on a CPU only when it takes < 80 % of fp32's time (noise must not flip it)


def resolve_drafter_dtype(
    dtype, device: torch.device, default: torch.dtype, width: int, rows: int, cache: str | Path | None = None
) -> torch.dtype:
    """A drafter's weight precision: ``None`` = ``default`` (the target's), ``auto`` = the fastest here (bf16 on
    CUDA; on a CPU the faster of fp32 and bf16 for a (8, width) x (width, rows) product, measured once per machine
    and shape when ``cache`` names a folder, else once per process: :func:`bf16_faster_here`), anything else as
    :func:`resolve_dtype`."""
    if dtype is None:
        return default
    if isinstance(dtype, str) and dtype == "auto":
        if device.type != "cpu":
            return torch.bfloat16
        return torch.bfloat16 if bf16_faster_here(width, rows, 8, cache) else torch.float32
    return resolve_dtype(dtype, device)


@functools.lru_cache(maxsize=16)
def cpu_bf16_faster(width: int, rows: int, reps: int = 9, m: int = 8) -> bool:
    """Whether a bf16 product (m, width) x (width, rows) runs in < BF16_MARGIN x the fp32 time on this CPU (m = 8: a
    drafting round's shape; training passes a larger ``m``). A few repetitions of one product, once per shape."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(rows, width, generator=gen)
    x = torch.randn(m, width, generator=gen)
    return _median_time(x.bfloat16(), w.bfloat16(), reps) < BF16_MARGIN * _median_time(x, w, reps)


def decode_bf16_faster(kind: str, cache: str | Path | None = None) -> bool:
    """Whether a target decodes faster in bf16 on a device of this kind: always on CUDA; on a CPU when a decode
    step's product (32 requests, 1024 x 4096) runs faster in bf16 (:func:`bf16_faster_here`)."""
    if kind != "cpu":
        return kind == "cuda"
    return bf16_faster_here(1024, 4096, 32, cache)


def bf16_faster_here(width: int, rows: int, m: int, cache: str | Path | None = None) -> bool:
    """:func:`cpu_bf16_faster` for one product shape, kept in ``cache`` (a folder; one file per CPU model and
    thread count, one entry per shape) so that it is measured once per machine and every later process makes the
    same choice: a few repetitions of one product on a busy machine can flip it, and a choice that names what data
    was made with, or which cached drafting profile a decode reads, must not flip with the load of the moment."""
    if cache is None:
        return cpu_bf16_faster(width, rows, m=m)
    import json

    from .atomic import atomic_write

    path = Path(cache) / f"{device_tag(torch.device('cpu'))}-bf16-faster-v2.json"
    key = f"{m}x{width}x{rows}"
    try:
        known = json.loads(path.read_text())
        known = known if isinstance(known, dict) else {}
    except (OSError, ValueError):  # absent or damaged: measured (again)
        known = {}
    if isinstance(known.get(key), bool):
        return known[key]
    known[key] = cpu_bf16_faster(width, rows, m=m)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(known, indent=1) + "\n")
    return known[key]


def _median_time(x: torch.Tensor, w: torch.Tensor, reps: int) -> float:
    times = []
    for i in range(reps + 2):
        t0 = time.perf_counter()
        torch.nn.functional.linear(x, w)
        if i >= 2:  # warm-up
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def cpu_model() -> str:
    """This CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def device_tag(device: torch.device) -> str:
    """A filesystem-safe description of the device this table is valid for."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f" {cpu_model()}-{torch.get_num_threads()}t"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", f"{device.type}-{name}").strip("_")
