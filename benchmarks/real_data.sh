#!/usr/bin/env bash
# make run's recipe on real, decontaminated data (docs/results.md; docs/data.md, "What real prompts buy at make run's budget"):
# the recipe's data at 7 and 14 training minutes, twice the data at 7, each decoded on the eval sets (static γ = 7,
# T = 0, batch 1, 10 prompts per set) and the 7-minute drafter on the held-out split of its own sources.
# Run alone on the machine (~75 minutes on 2 cores). Outputs: outputs/real_data/, benchmarks/results/data/real_data/.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1
PY=.venv/bin/python
CLI=.venv/bin/dspark-lightning
OUT=outputs/real_data
DOCS=benchmarks/results/data/real_data
mkdir -p "$OUT" "$DOCS"
SRC2X='[{"class_path": "reasoning_gym", "init_args": {"per_task":12,"seed":3}},{"class_path": "algorithms", "init_args": {"form":"both","sample":220}},'
SRC2X+='{"class_path": "sharegpt_v3", "init_args": {"domains":["code"],"language":"en","min_tokens":6,"max_tokens":192,"sample":140}},'
SRC2X+='{"class_path": "sharegpt_v3", "init_args": {"domains":["chat"],"language":"en","min_tokens":6,"max_tokens":192,"sample":320}}]'
M7=(--trainer.max_time '{minutes: 7}' --model.optim.time_budget_s 420)  # as measured (the recipe now trains 6.5)
latest() { ls -td outputs/smollm2_dspark/tb/version_*/drafter | head -1; }
probe() {  # drafter, name, extra args
  $PY benchmarks/acceptance_probe.py --drafter "$1" --gammas 7 --temperatures 0 --out "$OUT/probe_$2" "${@:3}"
  cp "$OUT/probe_$2/acceptance.json" "$DOCS/$2.json"
}
/usr/bin/time -v -o "$OUT/prepare_1x.time" $CLI prepare --config recipes/smollm2_dspark.yaml --data.work_dir "$OUT/data"
/usr/bin/time -v -o "$OUT/fit_1x_7m.time" $CLI fit --config recipes/smollm2_dspark.yaml --data.work_dir "$OUT/data" "${M7[@]}"
D=$(latest)
probe "$D" 1x_7m_eval --prompts_per_domain 10
probe "$D" 1x_7m_heldout --prompts "$OUT/data/responses_heldout.jsonl" --prompts_per_domain 6
$CLI prepare --config recipes/smollm2_dspark.yaml --data.work_dir "$OUT/data2x" --data.sources="$SRC2X"
$CLI fit --config recipes/smollm2_dspark.yaml --data.work_dir "$OUT/data2x" --data.sources="$SRC2X" --export '{servers: []}' \
  "${M7[@]}"
probe "$(latest)" 2x_7m_eval --prompts_per_domain 10
$CLI fit --config recipes/smollm2_dspark.yaml --data.work_dir "$OUT/data" --trainer.max_time '{minutes: 14}' \
  --model.optim.time_budget_s 840 --export '{servers: []}'
probe "$(latest)" 1x_14m_eval --prompts_per_domain 10
cp "$OUT/data/prepare_stats.json" "$DOCS/prepare_stats_1x.json"
grep -E "model name" /proc/cpuinfo | head -1 > "$DOCS/cpu.txt"
