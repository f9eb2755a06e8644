#!/usr/bin/env bash
# Fit recipes one after another, each timed (/usr/bin/time -v: wall clock, peak RSS) into <root>/time.log,
# skipping a recipe whose drafter is already exported.
#   bash scripts/fit_queue.sh recipes/compare/*.yaml
set -euo pipefail
export HF_HUB_OFFLINE=1
BIN="${DSPARK_BIN:-.venv/bin/dspark-lightning}"
for recipe in "$@"; do
  root=$(sed -n 's/^ *default_root_dir: *//p' "$recipe" | head -1)
  if [ -f "$root/tb/version_0/drafter/config.json" ]; then
    echo "[fit_queue] $recipe: $root already has an exported drafter, skipping"
    continue
  fi
  mkdir -p "$root"
  echo "[fit_queue] $recipe -> $root ($(date +%T))"
  /usr/bin/time -v -o "$root/time.log" "$BIN" fit --config "$recipe" > "$root/fit.log" 2>&1
  grep -a "held-out tau_hat" "$root/fit.log" || true
done
