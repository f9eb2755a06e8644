"""Test tooling, run by the vLLM venv's python: vLLM's Model Runner V2 on a CPU, then our worker.

vLLM 0.32 runs DSpark only in Model Runner V2 (``vllm/v1/worker/gpu/spec_decode/__init__.py``), and V2 needs Triton
with a ``cpu`` backend (``vllm/config/vllm.py`` ``use_v2_model_runner``, ``vllm/triton_utils/importing.py``);
triton-cpu is not on PyPI. This script registers a Triton ``cpu`` backend that compiles nothing and sets
``TRITON_INTERPRET=1``, so V2's Triton kernels run in Triton's interpreter, all inside this one process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the engine core is not a second process that would miss the registration).
Interpreted kernels make the speed meaningless; the token ids and the acceptance counters are what it is for.
Drop it once triton-cpu is on PyPI or vLLM has a CPU model runner that serves DSpark without Triton
(docs/serving.md, "vLLM, run here").

Usage: ``<vllm venv>/bin/python tests/slow/vllm_mrv2.py`` with the worker's protocol on stdin/stdout
(``dspark_lightning/export/vllm_worker.py``).
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"  # read when Triton's kernels are defined: before vLLM is imported
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "1")


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


if __name__ == "__main__":
    register_cpu_backend()
    worker = Path(__file__).resolve().parents[2] / "dspark_lightning" / "export" / "vllm_worker.py"
    sys.argv = [str(worker)]
    runpy.run_path(str(worker), run_name="__main__")
