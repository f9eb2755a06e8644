"""Matrix kernels chosen on the machine: y = x W^T (+ b) through the fastest path this CPU has, per weight shape and
row count.

On a CPU the same product has several implementations whose speed depends on the vendor and the row count: MKL's
GEMM on a row-major weight (``F.linear``), on its transposed copy (``x @ W^T``), with the weight as the left operand
(``(W x^T)^T``, a GEMV-like path for a few rows), oneDNN's linear, MKL's packed weights. None wins everywhere (on
some CPUs MKL's small-GEMM path is several times slower for a few rows than for one), so :func:`measure` times every
available path for every shape class of a model and every row count a decoding step can have, with the weights
streamed from memory as in a forward, and keeps the fastest. The choice is cached per (CPU model, threads, dtype)
(:func:`table_path`) next to the SPS table, which is measured with it.

Every path computes the same fp32 (or the model's dtype) product; only the summation order differs, as between any
two BLAS calls. The sampling law is the target's own whatever the kernel (tests/infer/test_kernels.py).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ...atomic import atomic_write
from ..profiling.busy import OtherLoad, too_busy

ROWS = (*range(1, 17), 24, 32, 64, 128)  # rows timed: one request's verification blocks, then prefill chunk sizes
SLOWER = 4.0  # a path this many times slower than the best on its first timed pass is timed no further
PACK_ROWS = 8  # MKL packs a weight for exactly this many rows; 4-8 rows are zero-padded to it
REPEATS = 5
FLUSH_BYTES = 64 << 20  # written between timed passes so that each pass reads its weights from memory
VERSION = 1  # bump when the paths or the timing change: older cached tables are measured again


def _linear(W, b, x):
    return F.linear(x, W, b)


def _onednn(W, b, x):
    return torch.ops.mkldnn._linear_pointwise(x, W, b, "none", [], "")


def _left(W, b, x):  # (W x^T)^T: the weight as the left operand
    y = torch.mm(W, x.t()).t().contiguous()
    return y if b is None else y + b


class _WeightCopies:
    """The extra copies of the weight (transposed, packed) some paths read, made only when a chosen path needs them."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight
        self._t: torch.Tensor | None = None
        self._packed: torch.Tensor | None = None

    @property
    def transposed(self) -> torch.Tensor:
        if self._t is None:
            self._t = self.weight.t().contiguous()
        return self._t

    @property
    def packed(self) -> torch.Tensor:
        if self._packed is None:
            self._packed = torch.ops.mkl._mkl_reorder_linear_weight(self.weight, PACK_ROWS)
        return self._packed


def _transposed(lay: _WeightCopies, b, x):
    y = x @ lay.transposed
    return y if b is None else y + b


def _mkl_packed(lay: _WeightCopies, b, x):
    M = x.shape[0]
    if M < PACK_ROWS:
        x = torch.cat([x, x.new_zeros(PACK_ROWS - M, x.shape[1])])
    return torch.ops.mkl._mkl_linear(x, lay.packed, lay.weight, b, PACK_ROWS)[:M]


# name -> (call(copies, bias, x2d) -> y2d, rows it serves)
PATHS: dict[str, tuple[Callable, Callable[[int], bool]]] = {
    "linear": (lambda lay, b, x: _linear(lay.weight, b, x), lambda M: True),
    "transposed": (_transposed, lambda M: True),
    "left": (lambda lay, b, x: _left(lay.weight, b, x), lambda M: M <= 32),
    "onednn": (lambda lay, b, x: _onednn(lay.weight, b, x), lambda M: True),
    "mkl_packed": (_mkl_packed, lambda M: 4 <= M <= PACK_ROWS),
}


def _works(name: str, dtype: torch.dtype) -> bool:
    """Whether this torch build runs the path on a CPU tensor of ``dtype`` (tried on a tiny product)."""
    if name == "mkl_packed" and dtype != torch.float32:
        return False
    try:
        w, x = torch.ones(8, 8, dtype=dtype), torch.ones(PACK_ROWS, 8, dtype=dtype)
        y = PATHS[name][0](_WeightCopies(w), None, x)
        return bool(torch.allclose(y.float(), torch.full((PACK_ROWS, 8), 8.0)))
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


def available_paths(device: torch.device, dtype: torch.dtype) -> list[str]:
    """Paths this device and dtype can run (on a GPU only ``linear``: its BLAS choice is the library's)."""
    if device.type != "cpu":
        return ["linear"]
    return [n for n in PATHS if n == "linear" or _works(n, dtype)]


def shape_key(weight: torch.Tensor) -> str:
    return f"{weight.shape[0]}x{weight.shape[1]}"


@dataclass
class KernelTable:
    """{shape "OUTxIN": {rows: path}} for one (device, dtype), with what was timed (``ms``) and how."""

    choices: dict[str, dict[int, str]] = field(default_factory=dict)
    ms: dict[str, dict[int, dict[str, float]]] = field(default_factory=dict)  # shape -> rows -> path -> ms a pass
    meta: dict[str, Any] = field(default_factory=dict)

    def path(self, key: str, rows: int) -> str:
        """The path for ``rows`` rows of shape ``key``: the timed row count itself, else the next timed one above
        (the largest beyond), ``linear`` for a shape never timed."""
        by_rows = self.choices.get(key)
        if not by_rows:
            return "linear"
        if rows in by_rows:
            return by_rows[rows]
        above = [r for r in by_rows if r >= rows]
        return by_rows[min(above) if above else max(by_rows)]

    def to_dict(self) -> dict[str, Any]:
        return {"version": VERSION, "choices": self.choices, "ms": self.ms, "meta": self.meta}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> KernelTable:
        choices = {k: {int(r): p for r, p in v.items() if p in PATHS} for k, v in d.get("choices", {}).items()}
        ms = {k: {int(r): dict(v) for r, v in by.items()} for k, by in d.get("ms", {}).items()}
        return cls(choices=choices, ms=ms, meta=dict(d.get("meta", {})))


class Linear:
    """y = x W^T (+ b) through the path a :class:`KernelTable` chose for this weight's shape and x's row count
    (``F.linear`` without a table). The weight is held by reference; a transposed or packed copy is made once,
    only when a chosen path reads it."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, table: KernelTable | None = None) -> None:
        self.weight, self.bias = weight, bias
        self.copies = _WeightCopies(weight)
        self.by_rows: dict[int, Callable] = {}
        self.table: KernelTable | None = None
        if table is not None:
            self.use(table)

    def use(self, table: KernelTable) -> None:
        """Take ``table``'s choices, making the weight copies they read now (not inside a request)."""
        self.table, self.by_rows = table, {}
        key = shape_key(self.weight)
        for rows in ROWS:
            name = table.path(key, rows)
            self.by_rows[rows] = PATHS[name][0]
            if name == "transposed":
                _ = self.copies.transposed
            elif name == "mkl_packed":
                _ = self.copies.packed

    def _call_for(self, rows: int) -> Callable:
        fn = self.by_rows.get(rows)
        if fn is None:
            name = self.table.path(shape_key(self.weight), rows) if self.table is not None else "linear"
            if not PATHS[name][1](rows):
                name = "linear"
            fn = self.by_rows[rows] = PATHS[name][0]
        return fn

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.table is None:
            return F.linear(x, self.weight, self.bias)
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        y = self._call_for(x2.shape[0])(self.copies, self.bias, x2)
        return y.view(*shape[:-1], y.shape[-1])


def measure(
    weights: dict[str, Sequence[tuple[torch.Tensor, torch.Tensor | None]]],
    rows: Sequence[int] = ROWS,
    repeats: int = REPEATS,
    paths: Sequence[str] | None = None,
    progress: bool = False,
) -> KernelTable:
    """Time every path on every shape class: one pass = the product over all of the class's weights (a model's
    layers, as a forward streams them), after a cache flush; the median of ``repeats`` interleaved passes per path."""
    first = next(iter(weights.values()))[0][0]
    dtype = first.dtype
    names = list(paths) if paths is not None else available_paths(first.device, dtype)
    table = KernelTable(meta={"paths": names})
    flush = torch.zeros(FLUSH_BYTES // 4)
    gen = torch.Generator().manual_seed(0)
    jobs = [(key, M) for key in weights for M in rows]
    from tqdm.auto import tqdm

    bar = tqdm(total=len(jobs), desc="timing matrix kernels", unit="shape", disable=not progress)
    for key, ws in weights.items():
        lays = [(_WeightCopies(w), b) for w, b in ws]
        for M in rows:
            x = torch.randn(M, ws[0][0].shape[1], generator=gen).to(dtype)
            cands = [n for n in names if PATHS[n][1](M)]
            samples: dict[str, list[float]] = {n: [] for n in cands}
            for rep in range(repeats + 1):  # the first pass of each path warms it up (weight copies, primitives)
                for n in cands:
                    if rep > 1 and samples[n][0] > SLOWER * min(v[0] for v in samples.values()):
                        continue  # far slower on its first timed pass: more passes cannot make it the choice
                    fn = PATHS[n][0]
                    flush.add_(1.0)
                    t0 = time.perf_counter()
                    for lay, b in lays:
                        fn(lay, b, x)
                    if rep:
                        samples[n].append(time.perf_counter() - t0)
            med = {n: sorted(s)[len(s) // 2] * 1e3 for n, s in samples.items()}
            table.ms.setdefault(key, {})[M] = {n: round(v, 4) for n, v in med.items()}
            table.choices.setdefault(key, {})[M] = min(med, key=med.get)
            bar.update(1)
        del lays
    bar.close()
    return table


def table_path(device: torch.device, dtype: torch.dtype) -> Path:
    from ...devices import device_tag
    from ...targets import cache_root

    return cache_root() / "kernels" / f"{device_tag(device)}-{str(dtype).removeprefix('torch.')}-v{VERSION}.json"


_LOCK = threading.Lock()
_MEMO: dict[Path, KernelTable] = {}


def for_weights(
    keys: set[str],
    weights: Callable[[], dict[str, Sequence[tuple[torch.Tensor, torch.Tensor | None]]]],
    device: torch.device,
    dtype: torch.dtype,
    progress: bool = True,
) -> KernelTable | None:
    """This machine's table covering the shapes ``keys``: read from the cache, the missing shapes measured once (on
    the weights ``weights()`` gives) and added. None on a GPU: its library chooses."""
    if device.type != "cpu":
        return None
    path = table_path(device, dtype)
    with _LOCK:
        table = _MEMO.get(path) or _read(path)
        if not set(keys) <= set(table.choices):
            missing = {k: v for k, v in weights().items() if k not in table.choices}
            if progress:
                print(f"[dspark-lightning] choosing this CPU's matrix kernels for {len(missing)} weight shapes "
                      f"(cached in {path})", flush=True)  # fmt: skip
            with OtherLoad() as load:
                new = measure(missing, progress=progress)
            table.choices.update(new.choices)
            table.ms.update(new.ms)
            table.meta = {**new.meta, "device": path.stem, "threads": torch.get_num_threads(),
                          "torch": torch.__version__, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                          "others_cpu_share": load.share}  # fmt: skip
            if not too_busy(table.meta, "the matrix-kernel choice", progress):  # else kept for this process only
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(path, json.dumps(table.to_dict(), indent=1) + "\n")
        _MEMO[path] = table
    return table


def _read(path: Path) -> KernelTable:
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError):
        return KernelTable()
    if not isinstance(d, dict) or d.get("version") != VERSION:
        return KernelTable()
    try:
        return KernelTable.from_dict(d)
    except (AttributeError, TypeError, ValueError):  # a damaged cache file is measured again
        return KernelTable()
