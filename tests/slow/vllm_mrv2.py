"""Test tooling, run by the vLLM venv's python: vLLM's Model Runner V2 on a CPU, then our worker with two ops of the
tests' own.

vLLM 0.32 runs DSpark only in Model Runner V2 (``vllm/v1/worker/gpu/spec_decode/__init__.py``), and V2 needs Triton
with a ``cpu`` backend (``vllm/config/vllm.py`` ``use_v2_model_runner``, ``vllm/triton_utils/importing.py``);
triton-cpu is not on PyPI. This script registers a Triton ``cpu`` backend that compiles nothing and sets
``TRITON_INTERPRET=1``, so V2's Triton kernels run in Triton's interpreter, all inside this one process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the engine core is not a second process that would miss the registration).
Interpreted kernels make the speed meaningless; the token ids and the acceptance counters are what it is for.
Drop it once triton-cpu is on PyPI or vLLM has a CPU model runner that serves DSpark without Triton
(docs/serving.md, "vLLM, run here").

Usage: ``<vllm venv>/bin/python tests/slow/vllm_mrv2.py`` with the worker's protocol on stdin/stdout
(``dspark_lightning/export/vllm_worker.py``), plus the ops ``{"op": "metrics"}`` -> vLLM's speculative-decoding
counters (``spec_decode_num_drafts``, ``..._num_draft_tokens``, ``..._num_accepted_tokens``,
``..._num_accepted_tokens_per_pos``) and ``{"op": "drafter"}`` -> what vLLM built from the draft's config (its class,
the confidence head's input width, whether its speculator uses it): ``VLLMWorker(..., script=MRV2).request("metrics")``.
The tests' process imports :func:`acceptance` from here (vLLM's counters in our terms); importing sets up nothing.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path
from typing import Any


def register_cpu_backend() -> None:
    """A Triton backend named ``cpu`` whose compiler and driver do nothing (the interpreter runs the kernels)."""
    from triton.backends import Backend, backends
    from triton.backends.compiler import BaseBackend, GPUTarget
    from triton.backends.driver import DriverBase

    class _Compiler(BaseBackend):
        binary_ext = "none"

        @staticmethod
        def supports_target(target) -> bool:
            return target.backend == "cpu"

        def hash(self) -> str:
            return "cpu-interpreter"

        def parse_options(self, options):
            raise RuntimeError("the cpu stub backend compiles nothing: set TRITON_INTERPRET=1")

        def add_stages(self, stages, options, language=None):
            raise RuntimeError("the cpu stub backend compiles nothing: set TRITON_INTERPRET=1")

        def load_dialects(self, context) -> None:
            return None

        def get_module_map(self):
            return {}

        def pack_metadata(self, metadata):
            return metadata

        def get_codegen_implementation(self, options):
            return {}

    class _Driver(DriverBase):
        @classmethod
        def is_active(cls) -> bool:
            return False  # never chosen by Triton itself; vLLM counts a ``cpu`` backend as the one driver

        def get_current_target(self):
            return GPUTarget("cpu", 0, 0)

        def get_active_torch_device(self):
            import torch

            return torch.device("cpu")

        def get_benchmarker(self):
            raise RuntimeError("no benchmarker on the cpu stub backend")

    backends["cpu"] = Backend(compiler=_Compiler, driver=_Driver)


def metrics(llm, req: dict) -> dict:  # noqa: ARG001 - the worker's op signature
    """vLLM's speculative-decoding counters so far."""
    out: dict = {}
    for m in llm.get_metrics():
        name = m.name.removeprefix("vllm:")
        if not name.startswith("spec_decode"):
            continue
        out[name] = list(m.values) if hasattr(m, "values") else m.value
    return out


def _find(obj, attr: str, depth: int = 8):
    """The first object reachable through plain attributes that has ``attr`` (vLLM's engine -> worker -> runner)."""
    seen, frontier = set(), [obj]
    for _ in range(depth):
        nxt = []
        for o in frontier:
            if id(o) in seen:
                continue
            seen.add(id(o))
            if hasattr(type(o), attr) or attr in getattr(o, "__dict__", {}):
                return o
            attrs = getattr(o, "__dict__", {}).items()
            nxt += [v for k, v in attrs if not k.startswith("__") and hasattr(v, "__dict__")]
        frontier = nxt
    return None


def drafter(llm, req: dict) -> dict:  # noqa: ARG001 - the worker's op signature
    """What vLLM built for the draft model: found through the in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0)."""
    spec = _find(llm.llm_engine, "speculator") or _find(llm.llm_engine, "drafter")
    if spec is None:
        return {"found": False}
    s = getattr(spec, "speculator", None) or getattr(spec, "drafter", None)
    model = getattr(s, "model", None)
    inner = getattr(model, "model", None)
    conf = getattr(inner, "confidence_head", None)
    proj = getattr(conf, "proj", None)
    markov = getattr(inner, "markov_head", None)
    return {
        "found": s is not None,
        "speculator": type(s).__name__,
        "model": type(model).__name__,
        "confidence_head": conf is not None,
        "confidence_in": getattr(proj, "input_size", None),
        "confidence_bias": getattr(proj, "bias", None) is not None,
        "confidence_with_markov": bool(getattr(conf, "with_markov", False)) if conf is not None else None,
        "uses_confidence_head": bool(getattr(s, "use_confidence_head", False)),
        "markov_rank": getattr(getattr(markov, "markov_w1", None), "embedding_dim", None),
        "sample_from_anchor": getattr(s, "sample_from_anchor", None),
    }


def acceptance(counters: dict[str, Any]) -> dict[str, Any]:
    """vLLM's counters (the ``metrics`` op) as our terms: rounds (drafts), survival S_k = accepted at position k /
    drafts, and the mean acceptance length (tokens committed per round, the bonus included: our τ)."""
    drafts = int(counters.get("spec_decode_num_drafts", 0))
    per_pos = [int(x) for x in counters.get("spec_decode_num_accepted_tokens_per_pos", [])]
    accepted = int(counters.get("spec_decode_num_accepted_tokens", sum(per_pos)))
    return {
        "drafts": drafts,
        "draft_tokens": int(counters.get("spec_decode_num_draft_tokens", 0)),
        "accepted": accepted,
        "accepted_per_pos": per_pos,
        "survival": [a / drafts for a in per_pos] if drafts else [],
        "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
    }


if __name__ == "__main__":
    os.environ["TRITON_INTERPRET"] = "1"  # read when Triton's kernels are defined: before vLLM is imported
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "1")
    register_cpu_backend()
    worker = Path(__file__).resolve().parents[2] / "dspark_lightning" / "export" / "vllm_worker.py"
    sys.argv = [str(worker)]
    runpy.run_path(str(worker), run_name="vllm_worker")["main"]({"metrics": metrics, "drafter": drafter})
