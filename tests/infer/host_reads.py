"""Counting device -> host synchronisations of a decoding round, on any device, CPU included (a test aid:
``tests/infer/test_syncs.py``, ``tests/unit/test_gpu_training_opts.py`` and ``scripts/gpu_check.py`` import it).

On an accelerator every read of a device tensor's value on the host (``.item()``, ``int(t)``, ``bool(t)``,
``.tolist()``, ``.nonzero()``, boolean-mask indexing, ``.cpu()``) waits for the device queue to drain. A round
should pay two: the confidences the scheduler reads, and the packed results of acceptance. On a CPU nothing
waits, so such reads go unnoticed; :class:`HostReads` makes them visible by intercepting torch calls:

- a tensor is *host* when it was made by ``.cpu()`` / ``.numpy()`` (counted as one transfer), by a factory call
  without a ``device=`` argument, or by an op whose tensor inputs are all host tensors;
- every other tensor is *device* (factories given ``device=``, ``.to(device)``, model outputs, caches, and any
  tensor made before the counter started), and each value read of a device tensor counts one synchronisation.

This is how CUDA behaves when the engine's device is a GPU and the default device is the CPU. While it counts, the
runtime's :func:`dspark_lightning.infer.acceptance.sampling.reads_are_free` answers False, so the code takes the paths
it takes on an accelerator (a CPU skips no data-dependent shortcut) and the count is the accelerator path's. On CUDA
itself, ``torch.cuda.set_sync_debug_mode`` is the ground truth (``scripts/gpu_check.py`` reports both).
"""

from __future__ import annotations

import os
import sys
import weakref
from collections import Counter

import torch
from torch.overrides import TorchFunctionMode

import dspark_lightning
from dspark_lightning.infer.acceptance import sampling

PACKAGE = os.path.dirname(os.path.abspath(dspark_lightning.__file__)) + os.sep

T = torch.Tensor
READS = {T.item, T.tolist, T.__bool__, T.__int__, T.__float__, T.__index__, T.nonzero, torch.nonzero,
         T.masked_select, torch.masked_select}  # fmt: skip
TRANSFERS = {T.cpu, T.numpy}
FACTORIES = {torch.tensor, torch.as_tensor, torch.zeros, torch.ones, torch.full, torch.empty, torch.arange,
             torch.zeros_like, torch.ones_like, torch.full_like, torch.empty_like, torch.rand, torch.randn}  # fmt: skip
LIKE = {torch.zeros_like, torch.ones_like, torch.full_like, torch.empty_like}


def _reads_are_never_free(device: torch.device) -> bool:  # noqa: ARG001 - the signature it stands in for
    return False


_REAL = sampling.reads_are_free
_DEPTH = 0  # HostReads counters running (they may nest)


def _point_reads_are_free(to) -> None:
    """Point every module of the package that holds either version of ``reads_are_free`` at ``to``."""
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] == "dspark_lightning" and getattr(module, "reads_are_free", None) in (
                _REAL, _reads_are_never_free):  # fmt: skip
            module.reads_are_free = to


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, list | tuple):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)


def _bool_index(idx) -> bool:
    return any(t.dtype == torch.bool for t in _tensors(idx))


def _caller() -> str:
    """The innermost line of the package on the stack, as ``infer/engine.py:123``."""
    import traceback

    for fr in reversed(traceback.extract_stack()[:-3]):
        if fr.filename.startswith(PACKAGE):
            return f"{fr.filename[len(PACKAGE) :]}:{fr.lineno}"
    return "?"


class HostReads(TorchFunctionMode):
    """``with HostReads() as h: ...`` -> ``h.count`` device -> host syncs, ``h.where`` a Counter by call name."""

    def __init__(self, trace: bool = False) -> None:
        super().__init__()
        self.trace = trace  # also count by the calling line (``sites``), for finding them
        self.sites: Counter = Counter()
        self.host: dict[int, weakref.ref] = {}  # id -> the host tensor (tensors compare elementwise: no set)
        self.count = 0
        self.where: Counter = Counter()

    def __enter__(self):
        global _DEPTH
        if _DEPTH == 0:
            _point_reads_are_free(_reads_are_never_free)
        _DEPTH += 1
        return super().__enter__()

    def __exit__(self, *exc):
        global _DEPTH
        _DEPTH -= 1
        if _DEPTH == 0:
            _point_reads_are_free(_REAL)
        return super().__exit__(*exc)

    def _device(self, t: torch.Tensor) -> bool:
        ref = self.host.get(id(t))
        return ref is None or ref() is not t

    def _mark(self, t: torch.Tensor) -> None:
        self.host[id(t)] = weakref.ref(t)

    def _sync(self, name: str) -> None:
        self.count += 1
        self.where[name] += 1
        if self.trace:
            self.sites[f"{name} at {_caller()}"] += 1

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        ins = list(_tensors(args)) + list(_tensors(kwargs))
        if func in TRANSFERS:
            if ins and self._device(ins[0]):
                self._sync(name)
            out = func(*args, **kwargs)
            if isinstance(out, torch.Tensor):
                out = out.clone() if out is args[0] else out  # a real transfer makes a new tensor
                self._mark(out)
            return out
        if func in READS and ins and self._device(ins[0]):
            self._sync(name)
        elif func is T.__getitem__ and self._device(args[0]) and _bool_index(args[1:]):
            self._sync("bool-mask index")
        elif func is T.__setitem__ and _bool_index(args[1:2]) and isinstance(args[2], torch.Tensor):
            self._sync("bool-mask assign")
        out = func(*args, **kwargs)
        if func is T.to and any(isinstance(a, str | torch.device) for a in (*args[1:], kwargs.get("device"))):
            out = out.clone() if out is args[0] else out  # .to(engine device): an upload makes a device tensor
            host = False
        elif func in FACTORIES:
            host = "device" not in kwargs if func not in LIKE else (not ins or not self._device(ins[0]))
        else:
            host = bool(ins) and not any(self._device(t) for t in ins)
        if host:
            for t in _tensors(out):
                self._mark(t)
        return out
