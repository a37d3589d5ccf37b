#!/usr/bin/env bash
# The device check of the LLM engine, one prepared command of at most 7 minutes (the GPU
# machines here are air-gapped: no hub, no package index, 64 MiB carried per call).
#
# Here, once (writes .gpu-check/, a few MB, ignored by git):
#   python3 scripts/gpu_check.py prepare
#   # wheels the device lacks, into .whl/ (python 3.12, manylinux, --no-deps; see the device
#   # tool's README). A CUDA 13 image with PyTorch lacks, for the Whisper half: ctranslate2,
#   # faster-whisper, pydantic, pydantic-core, annotated-types, typing-inspection (47 MB);
#   # for the LLM half's CTranslate2 checks also jsonschema, jsonschema-specifications,
#   # referencing and rpds-py (0.6 MB).
#   # vLLM 0.32 (327 MB, pinning torch 2.13) does not fit in one 64 MiB carry: its part SKIPs.
# On the device, with carry [".gpu-check", ".whl"]:
#   bash scripts/gpu_check.sh
# In CPU mode (the suite runs this, so the check cannot rot):
#   bash scripts/gpu_check.sh --cpu --docs 16
#
# The LLM half (scripts/gpu_check.py, up to 4 min): builds the models from the carried configs
# with dummy weights, runs the structural checks and times overnight's task layer against one
# raw generate. The Whisper half (scripts/gpu_check_whisper.py, up to 3 min): builds a
# random-weight Whisper, loads it through overnight's worker (a broken CUDA library must fail
# at load) and times one against two model workers on the device. A missing engine or missing
# configs: a SKIP line for that half and exit 0. Everything lands in $OUT (default
# ./gpu-check-out).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-check-out}"
CONFIGS="${GPU_CHECK_DIR:-.gpu-check}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"

cpu=()
for arg in "$@"; do [ "$arg" = --cpu ] && cpu=(--cpu); done
# The carried wheels are for the device (python 3.12 there); CPU mode runs on this install.
if [ ${#cpu[@]} -eq 0 ] && ls .whl/*.whl >/dev/null 2>&1; then
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
timeout "${GPU_CHECK_TIMEOUT:-240}" "$PY" scripts/gpu_check.py run --dir "$CONFIGS" --out "$OUT" "$@" \
  >"$OUT/gpu_check.log" 2>&1
rc=$?
grep -E '^gpu_check:|"(status|ratio|generated_tokens_per_s|vllm|ctranslate2)"' "$OUT/gpu_check.log"
timeout "${GPU_CHECK_WHISPER_TIMEOUT:-180}" "$PY" scripts/gpu_check_whisper.py run --dir "$CONFIGS" \
  --out "$OUT" "${cpu[@]}" >"$OUT/whisper.log" 2>&1
wrc=$?
grep -E '^gpu_check:|"(status|message|cublas_shim)"' "$OUT/whisper.log"
echo "gpu_check: rc $rc (LLM), $wrc (Whisper); logs, gpu_check.json and whisper_check.json in $OUT"
[ "$rc" -ne 0 ] && exit "$rc"
exit "$wrc"
