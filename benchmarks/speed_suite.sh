#!/usr/bin/env bash
# Every measurement of benchmarks/results/results_log.md "Speculation that pays", one after another, alone on the machine:
#   bash benchmarks/speed_suite.sh [LONG_DRAFTER_DIR]            (make speed-suite)
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1
PY=.venv/bin/python
CLI=.venv/bin/dspark-lightning
LONG=${1:-outputs/smollm2_dspark_long/tb/version_0/drafter}
lscpu | grep -E "Model name|^CPU\(s\)" | tee benchmarks/results/data/speed_suite_cpu.txt
$PY benchmarks/plot_tau_curve.py outputs/smollm2_dspark_long --out benchmarks/results/img/tau_curve_long.png
$PY benchmarks/profile_breakdown.py verify --out benchmarks/results/data/verify_profile
$CLI profile --target smollm2-135m-instruct --max_tokens 64 --out benchmarks/results/data/sps_smollm2_cpu_lean.json \
    --plot benchmarks/results/img/sps_smollm2_cpu_lean.png
$PY benchmarks/profile_breakdown.py draft --drafter "$LONG" --out benchmarks/results/data/draft_profile
$PY benchmarks/vocab_coverage.py --work_dir outputs/smollm2_dspark_long/data --out benchmarks/results/data/vocab_coverage
$PY benchmarks/bench_regen.py --prompts 48 --max_new_tokens 128 --out benchmarks/results/data/regen_bench
$CLI bench --drafter long="$LONG" --sps benchmarks/results/data/sps_smollm2_cpu_lean.json --temperatures [0,1] --batches 1 \
    --prompts_per_domain 3 --max_new_tokens 128 --repeats 2 --out benchmarks/results/data/bench_speed_b1
$CLI bench --drafter long="$LONG" --sps benchmarks/results/data/sps_smollm2_cpu_lean.json --temperatures 0 --batches 8 \
    --prompts_per_domain 3 --max_new_tokens 128 --repeats 2 --out benchmarks/results/data/bench_speed_b8
