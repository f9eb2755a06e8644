# Fresh machine: `make run` (set up + train the embedded default) or `make test` (set up + test suite).
VENV := .venv
PY := $(VENV)/bin/python
export HF_HUB_OFFLINE := 1

.PHONY: setup run test test-fast lint bench bench-decode

$(VENV)/.setup-done: pyproject.toml scripts/setup.sh plugins/dspark_example_head/pyproject.toml
	bash scripts/setup.sh

setup: $(VENV)/.setup-done

run: setup
	$(VENV)/bin/dspark-lightning fit --config recipes/smollm2_dspark.yaml

test: setup
	$(PY) -m pytest -q

test-fast: setup
	$(PY) -m pytest -q -m "not slow" tests/unit tests/data tests/infer

lint: setup
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

# The embedded-default run, timed (peak RSS, wall), then its tables for docs/benchmarks.md.
bench: setup
	rm -rf outputs/smollm2_dspark && mkdir -p outputs/smollm2_dspark
	/usr/bin/time -v -o outputs/smollm2_dspark/time.log $(VENV)/bin/dspark-lightning fit --config recipes/smollm2_dspark.yaml
	$(PY) scripts/bench_report.py outputs/smollm2_dspark --time-log outputs/smollm2_dspark/time.log

# Decoding benchmark of the drafter trained by `make run` / `make bench` (docs/inference.md).
DRAFTER ?= outputs/smollm2_dspark/tb/version_0/drafter
bench-decode: setup
	$(VENV)/bin/dspark-lightning profile --target smollm2-135m-instruct --out docs/data/sps_smollm2_cpu.json --plot docs/img/sps_smollm2_cpu.png
	$(PY) scripts/bench_decode.py --drafter $(DRAFTER) --sps docs/data/sps_smollm2_cpu.json --out docs/data/decode_bench
	$(PY) scripts/bench_decode.py --drafter $(DRAFTER) --sps docs/data/sps_smollm2_cpu.json --out docs/data/decode_bench --layout_study
