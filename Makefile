# Fresh machine: `make run` (set up + train the embedded default) or `make test` (set up + test suite).
VENV := .venv
PY := $(VENV)/bin/python
export HF_HUB_OFFLINE := 1

.PHONY: setup run test test-fast lint bench bench-decode compare eval-compare bench-compare ablations \
	calibrate threshold-sweep serve-bench serve-study profile-verify profile-draft bench-regen long long-dflash \
	vocab-coverage sps-lean bench-speed speed-suite acceptance acceptance-main matrix-data matrix bench-main bench-long gpu-wheels gpu-check gpu-check-cpu serve-bench-gate

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

# Issue 4 (docs/results.md): equal-budget DSpark / DFlash / EAGLE-3 / MTP-1, their evaluation and benchmark, ablations.
C := outputs/compare
DRAFTERS := --drafter dspark=$(C)/dspark/tb/version_0/drafter --drafter dflash=$(C)/dflash/tb/version_0/drafter \
	--drafter eagle3=$(C)/eagle3/tb/version_0/drafter --drafter mtp1=$(C)/mtp1/tb/version_0/drafter
compare: setup
	bash scripts/fit_queue.sh recipes/compare/dspark.yaml recipes/compare/dflash.yaml recipes/compare/eagle3.yaml recipes/compare/mtp1.yaml

eval-compare: setup
	$(VENV)/bin/dspark-lightning eval $(DRAFTERS) --prompts_per_domain 8 --max_new_tokens 96 --batch_size 8 --out docs/data/eval_t1

bench-compare: setup
	$(VENV)/bin/dspark-lightning bench $(DRAFTERS) --sps docs/data/sps_smollm2_cpu.json --prompts_per_domain 2 --max_new_tokens 48 --out docs/data/bench

ablations: setup
	bash scripts/fit_queue.sh recipes/ablations/*.yaml
	$(PY) scripts/ablation_tables.py --out docs/data/ablations

# Calibration and load-aware serving (docs/results.md): STS on the equal-budget DSpark drafter, the threshold sweep
# and the closed-loop concurrency study, all at T = 1.
DSPARK := $(C)/dspark/tb/version_0/drafter
calibrate: setup
	$(VENV)/bin/dspark-lightning calibrate --drafter $(DSPARK) --prompts_per_domain 32 --max_new_tokens 128 --report_dir docs/data/calibration_t1

threshold-sweep: setup
	$(VENV)/bin/dspark-lightning threshold-sweep --drafter $(DSPARK) --prompts_per_domain 6 --max_new_tokens 48 --out docs/data/threshold_sweep
	$(VENV)/bin/dspark-lightning threshold-sweep --drafter $(DSPARK) --prompts_per_domain 6 --max_new_tokens 48 --mode raw --raw_confidences true --out docs/data/threshold_sweep_raw

serve-bench: setup
	$(VENV)/bin/dspark-lightning serve-bench --drafter $(DSPARK) --sps docs/data/sps_smollm2_cpu.json --prompts_per_domain 8 --window_s 15 --repeats 2 --out docs/data/serve_bench
	$(VENV)/bin/dspark-lightning serve-bench --drafter $(DSPARK) --sps docs/data/sps_smollm2_cpu.json --prompts_per_domain 8 --window_s 15 --repeats 2 --layout flat --concurrency 8 16 32 --methods plain static:1 hardware_aware async_hardware_aware --out docs/data/serve_bench_flat

serve-study: calibrate threshold-sweep serve-bench

# Speculation that pays on this machine (docs/results.md): verification and drafting cost, regeneration speed, the
# long recipes, the draft-vocabulary coverage table and the speed benchmark. Run each alone on the machine.
# the latest exported version of each run (a resumed run writes a new version folder)
latest = $(lastword $(sort $(wildcard outputs/$(1)/tb/version_*/drafter)))
LONG ?= $(call latest,smollm2_dspark_long)
LONG_DFLASH ?= $(call latest,smollm2_dflash_long)
MAIN ?= $(call latest,smollm2_dspark)
profile-verify: setup
	$(PY) scripts/profile_verify.py --out docs/data/verify_profile

profile-draft: setup
	$(PY) scripts/profile_draft.py --drafter $(LONG) --out docs/data/draft_profile

bench-regen: setup
	$(PY) scripts/bench_regen.py --out docs/data/regen_bench

long: setup
	mkdir -p outputs/smollm2_dspark_long
	/usr/bin/time -v -o outputs/smollm2_dspark_long/time.log $(VENV)/bin/dspark-lightning fit --config recipes/smollm2_dspark_long.yaml

long-dflash: setup
	$(VENV)/bin/dspark-lightning fit --config recipes/smollm2_dflash_long.yaml

vocab-coverage: setup
	$(PY) scripts/vocab_coverage.py --work_dir outputs/smollm2_dspark_long/data --out docs/data/vocab_coverage

sps-lean: setup
	$(VENV)/bin/dspark-lightning profile --target smollm2-135m-instruct --max_tokens 64 --out docs/data/sps_smollm2_cpu_lean.json --plot docs/img/sps_smollm2_cpu_lean.png

bench-speed: setup
	$(VENV)/bin/dspark-lightning bench --drafter long=$(LONG) --sps docs/data/sps_smollm2_cpu_lean.json --temperatures 0 1 \
		--batches 1 --prompts_per_domain 3 --max_new_tokens 128 --repeats 2 --out docs/data/bench_speed_b1
	$(VENV)/bin/dspark-lightning bench --drafter long=$(LONG) --sps docs/data/sps_smollm2_cpu_lean.json --temperatures 0 \
		--batches 8 --prompts_per_domain 3 --max_new_tokens 128 --repeats 2 --out docs/data/bench_speed_b8

# What the drafter itself accepts with a fixed block (no scheduler, no gate).
acceptance: setup
	$(PY) scripts/acceptance_probe.py --drafter $(LONG) --prompts_per_domain 10 --gammas 7 --temperatures 0 1 \
		--out docs/data/acceptance_long

# The same probe for make run's drafter, T = 0, γ = 7 (issue 18's make-run bar).
acceptance-main: setup
	$(PY) scripts/acceptance_probe.py --drafter $(MAIN) --prompts_per_domain 10 --gammas 7 --temperatures 0 \
		--out docs/data/acceptance_main

# Issue 18's experiment matrix (docs/matrix.md): shared data once, then fixed wall-clock cells; run alone.
matrix-data: setup
	$(VENV)/bin/dspark-lightning prepare --config recipes/matrix/base.yaml

matrix: matrix-data
	$(PY) scripts/matrix.py --minutes 6 --out docs/data/matrix
	$(PY) scripts/matrix.py --only best --minutes 3 6 12 --out docs/data/matrix

# Issue 18's speed bars: both drafters, T = 0 and 1, batch 1, with the draft gate; Algorithm 1 (hardware_aware) and the
# asynchronous variant, whose global budget search escapes the step in this CPU's SPS curve (docs/matrix.md).
bench-long: setup
	for s in hardware_aware async_hardware_aware; do \
		$(VENV)/bin/dspark-lightning bench --drafter main=$(MAIN) --drafter long=$(LONG) --sps docs/data/sps_smollm2_cpu_lean.json \
			--scheduler $$s --temperatures 0 1 --batches 1 --prompts_per_domain 3 --max_new_tokens 128 --repeats 2 \
			--out docs/data/bench_long$$( [ $$s = hardware_aware ] || echo _async ) || exit 1; \
	done

# make run's drafter next to the long recipe's, T = 0, batch 1 (issue 12 item 6).
bench-main: setup
	$(VENV)/bin/dspark-lightning bench --drafter main=$(MAIN) --drafter long=$(LONG) --sps docs/data/sps_smollm2_cpu_lean.json \
		--temperatures 0 --batches 1 --prompts_per_domain 3 --max_new_tokens 128 --repeats 2 --out docs/data/bench_main

# Pure-Python wheels the GPU check needs beyond what a device machine has (carry .gpu_wheels with the tree).
gpu-wheels: setup
	$(PY) -m pip download --no-deps --only-binary=:all: -d .gpu_wheels jsonargparse==4.53.0 docstring-parser==0.18.0 \
		typeshed-client==2.15.0 webdataset==1.0.2 braceexpand==0.1.7

# The accelerator check (docs/gpu.md); `make gpu-check-cpu` runs the same code paths on this CPU in a minute.
gpu-check:
	bash scripts/gpu_check.sh

gpu-check-cpu: setup
	$(PY) scripts/gpu_check.py --device cpu --dtype bf16 --quick --out outputs/gpu_check_cpu

# The draft gate under load: plain decoding against the hardware-aware scheduler (gate on), N = 1-32.
serve-bench-gate: setup
	$(VENV)/bin/dspark-lightning serve-bench --drafter $(LONG) --sps docs/data/sps_smollm2_cpu_lean.json --prompts_per_domain 4 \
		--concurrency 1 4 16 32 --methods plain hardware_aware --window_s 10 --repeats 1 --out docs/data/serve_bench_gate

# All of the above in one go (what docs/results.md reports), after `make long`.
speed-suite: setup
	bash scripts/speed_suite.sh $(LONG)
