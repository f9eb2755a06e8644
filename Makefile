# Fresh machine: `make run` (set up + train the embedded default) or `make test` (set up + test suite).
VENV := .venv
PY := $(VENV)/bin/python
export HF_HUB_OFFLINE := 1

.PHONY: setup run test test-fast lint

$(VENV)/.setup-done: pyproject.toml scripts/setup.sh plugins/dspark_example_head/pyproject.toml
	bash scripts/setup.sh

setup: $(VENV)/.setup-done

run: setup
	$(VENV)/bin/dspark-lightning fit --config recipes/smollm2_dspark.yaml

test: setup
	$(PY) -m pytest -q

test-fast: setup
	$(PY) -m pytest -q -m "not slow" tests/unit tests/data

lint: setup
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .
