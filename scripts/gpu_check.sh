#!/usr/bin/env bash
# The accelerator check (docs/gpu.md): one script, ≤ 8 minutes on one GPU, from the source tree.
#   bash scripts/gpu_check.sh [--device cuda:0] [--dtype bf16]
# The device machine has torch, transformers, lightning, torchmetrics and safetensors but no package registry:
# the few pure-Python wheels we need beyond those travel in .gpu_wheels/ (make gpu-wheels; carry that folder).
# Results: $OUT/gpu_check.md (markdown table) and gpu_check.json; exit code 1 when a check fails.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export DSPARK_CACHE="${DSPARK_CACHE:-${TMPDIR:-/tmp}/dspark_cache}"
PY=${PYTHON:-python3}
if [ -d .gpu_wheels ] && ls .gpu_wheels/*.whl >/dev/null 2>&1; then
    missing=$($PY - <<'PYEOF'
import importlib.util
print(" ".join(m for m in ("jsonargparse", "webdataset", "braceexpand", "docstring_parser", "typeshed_client")
               if importlib.util.find_spec(m) is None))
PYEOF
)
    if [ -n "$missing" ]; then
        echo "installing carried wheels for: $missing"
        $PY -m pip install --quiet --no-index --no-deps --find-links .gpu_wheels .gpu_wheels/*.whl
    fi
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
exec $PY scripts/gpu_check.py --out "${OUT:-outputs/gpu_check}" "$@"
