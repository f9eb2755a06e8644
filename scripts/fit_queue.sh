#!/usr/bin/env bash
# Fit recipes one after another, each timed (/usr/bin/time -v: wall clock, peak RSS) into <root>/time.log,
# skipping a run whose drafter is already exported.
#   bash scripts/fit_queue.sh recipes/compare/*.yaml                   recipes as written
#   bash scripts/fit_queue.sh --queue benchmarks/ablations.queue       the runs of a queue file
#   bash scripts/fit_queue.sh --dry-run --queue FILE [RECIPE ...]      print each fit command, run nothing
# A queue file holds one run per line: its run directory, a base recipe, then `dspark-lightning fit` overrides
# (split at whitespace, so none may contain a space: --model.block_size=3). The run directory becomes the run's
# trainer.default_root_dir and the save_dir of its two loggers, TensorBoard (tb) and CSV (csv): the layout every
# recipe in recipes/ logs in and the tables read. `#` starts a comment.
set -euo pipefail
export HF_HUB_OFFLINE=1
BIN="${DSPARK_BIN:-.venv/bin/dspark-lightning}"
dry=0
queue=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry=1; shift ;;
    --queue) queue="${2:?--queue needs a file}"; shift 2 ;;
    *) break ;;
  esac
done

fit_one() {  # fit_one LABEL ROOT FIT-ARGS...
  local label="$1" root="$2"
  shift 2
  if [ "$dry" = 1 ]; then
    printf '%q ' "$BIN" fit "$@"
    echo
    return
  fi
  if [ -f "$root/tb/version_0/drafter/config.json" ]; then
    echo "[fit_queue] $label: $root already has an exported drafter, skipping"
    return
  fi
  mkdir -p "$root"
  echo "[fit_queue] $label -> $root ($(date +%T))"
  /usr/bin/time -v -o "$root/time.log" "$BIN" fit "$@" > "$root/fit.log" 2>&1 < /dev/null
  grep -a "held-out tau_hat" "$root/fit.log" || true
}

if [ -n "$queue" ]; then
  [ -f "$queue" ] || { echo "[fit_queue] no queue file $queue" >&2; exit 2; }
  mapfile -t lines < "$queue"
  for line in "${lines[@]}"; do
    line="${line%%#*}"
    read -r -a words <<< "$line"
    [ "${#words[@]}" -eq 0 ] && continue
    if [ "${#words[@]}" -lt 2 ]; then
      echo "[fit_queue] $queue: '$line' wants a run directory and a base recipe" >&2
      exit 2
    fi
    root="${words[0]}"
    recipe="${words[1]}"
    loggers="[{class_path: lightning.pytorch.loggers.TensorBoardLogger, init_args: {save_dir: $root, name: tb}},"
    loggers+=" {class_path: lightning.pytorch.loggers.CSVLogger, init_args: {save_dir: $root, name: csv}}]"
    fit_one "$root" "$root" --config "$recipe" "--trainer.default_root_dir=$root" "--trainer.logger=$loggers" \
      "${words[@]:2}"
  done
fi

for recipe in "$@"; do
  root=$(sed -n 's/^ *default_root_dir: *//p' "$recipe" | head -1)
  fit_one "$recipe" "$root" --config "$recipe"
done
