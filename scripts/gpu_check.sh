#!/usr/bin/env bash
# The device check of the LLM engine, one prepared command of at most 7 minutes (the GPU
# machines here are air-gapped: no hub, no package index, 64 MiB carried per call).
#
# Here, once (writes .gpu-check/, a few MB, ignored by git):
#   python3 scripts/gpu_check.py prepare
#   # optional: wheels the device lacks, into .whl/ (see the device tool's README)
# On the device, with carry [".gpu-check", ".whl"]:
#   bash scripts/gpu_check.sh
# In CPU mode (the suite runs this, so the check cannot rot):
#   bash scripts/gpu_check.sh --cpu --docs 16
#
# Builds the models from the carried configs with dummy weights, runs the structural checks
# and times overnight's task layer against one raw generate (scripts/gpu_check.py). Missing
# vLLM or configs: a SKIP line and exit 0. Everything lands in $OUT (default ./gpu-check-out).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-check-out}"
CONFIGS="${GPU_CHECK_DIR:-.gpu-check}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"

if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/gpu-check-site .whl/*.whl >"$OUT/pip.log" 2>&1 \
    || { echo "gpu_check: FAIL: the carried wheels do not install (see $OUT/pip.log)"; exit 2; }
  export PYTHONPATH="/tmp/gpu-check-site${PYTHONPATH:+:$PYTHONPATH}"
fi
if [ ! -f "$CONFIGS/tiny/config.json" ]; then
  echo "gpu_check: SKIP: no model configs in $CONFIGS (run: python3 scripts/gpu_check.py prepare)"
  exit 0
fi
{
  date -u
  uptime
  nvidia-smi 2>&1 || echo "nvidia-smi: not found"
} >"$OUT/env.txt"
timeout "${GPU_CHECK_TIMEOUT:-420}" "$PY" scripts/gpu_check.py run --dir "$CONFIGS" --out "$OUT" "$@" \
  >"$OUT/gpu_check.log" 2>&1
rc=$?
grep -E '^gpu_check:|"(status|ratio|generated_tokens_per_s|vllm|ctranslate2)"' "$OUT/gpu_check.log"
echo "gpu_check: rc $rc (logs and gpu_check.json in $OUT)"
exit "$rc"
