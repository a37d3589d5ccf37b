#!/usr/bin/env bash
# The GPU acceptance check of the document job, in one short command (about 5-8 minutes on
# one H100/H200 with a small model):
#
#   1. the vLLM backend's gpu-marked tests (tests/workers/test_llm_vllm.py: generate,
#      summarize with map-reduce, extract with structured output, classify with a guided choice);
#   2. a throughput measurement: scripts/bench_process.py --backend vllm, a one-document-at-a-time
#      vLLM loop versus overnight's pipeline (Ray Data, one vLLM actor) on the same documents.
#
#   OVERNIGHT_GPU_TEST_MODEL=/models/SmolLM2-135M-Instruct scripts/gpu_check.sh
#
# The machine needs the model already there: a local Hugging Face model directory, or a hub
# name in the local Hugging Face cache. Hub downloads are off (HF_HUB_OFFLINE=1) unless you
# set HF_HUB_OFFLINE=0 on a machine that can reach the hub.
#
# Environment:
#   OVERNIGHT_GPU_TEST_MODEL  model path or hub name (default HuggingFaceTB/SmolLM2-135M-Instruct)
#   GPU_CHECK_DOCS            documents for the throughput run (default 256)
#   GPU_CHECK_TEST_TIMEOUT    seconds for the tests (default 300)
#   GPU_CHECK_BENCH_TIMEOUT   seconds for the throughput run (default 300)
#   OUT                       where logs and figures go (default ./gpu-check-out)
#
# Writes under $OUT: env.txt (GPU, versions), pytest-gpu.log and junit-gpu.xml,
# bench-process-vllm.log and bench-process-vllm.json, summary.txt. Exits 0 only when the tests
# passed (none skipped) and the throughput run finished.
set -uo pipefail

cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-check-out}"
mkdir -p "$OUT"
MODEL="${OVERNIGHT_GPU_TEST_MODEL:-HuggingFaceTB/SmolLM2-135M-Instruct}"
DOCS="${GPU_CHECK_DOCS:-256}"
TEST_TIMEOUT="${GPU_CHECK_TEST_TIMEOUT:-300}"
BENCH_TIMEOUT="${GPU_CHECK_BENCH_TIMEOUT:-300}"
PYTHON="${PYTHON:-python}"
export OVERNIGHT_GPU_TEST_MODEL="$MODEL"
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"
export TRANSFORMERS_OFFLINE="${TRANSFORMERS_OFFLINE:-$HF_HUB_OFFLINE}"
export RAY_USAGE_STATS_ENABLED=0
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }

{
    date -u
    uptime
    nvidia-smi 2>&1 || echo "nvidia-smi: not found"
} >"$OUT/env.txt"
if ! nvidia-smi -L >/dev/null 2>&1; then
    note "FAIL: no NVIDIA GPU visible (nvidia-smi -L failed); see $OUT/env.txt"
    exit 2
fi

if ! "$PYTHON" -c "import vllm, pytest" >/dev/null 2>&1; then
    note "vllm or pytest missing: pip install -e '.[gpu,dev]' (log: $OUT/pip.log)"
    if ! timeout 900 "$PYTHON" -m pip install -q -e ".[gpu,dev]" >"$OUT/pip.log" 2>&1; then
        note "FAIL: could not install the gpu extra (no network? install vllm first); see $OUT/pip.log"
        exit 2
    fi
fi
"$PYTHON" - >>"$OUT/env.txt" 2>&1 <<'EOF'
import ctranslate2, ray, torch, vllm
print("vllm", vllm.__version__, "torch", torch.__version__, "cuda", torch.version.cuda)
print("ray", ray.__version__, "ctranslate2", ctranslate2.__version__)
print("gpu", torch.cuda.get_device_name(0), torch.cuda.device_count(), "device(s)")
EOF
note "model: $MODEL (HF_HUB_OFFLINE=$HF_HUB_OFFLINE)"
status=0

# 1. The gpu-marked tests. -m gpu replaces the default "not gpu" selection.
start=$(date +%s)
timeout "$TEST_TIMEOUT" "$PYTHON" -m pytest -m gpu tests/workers/test_llm_vllm.py \
    -p no:cacheprovider -v -rs --junitxml="$OUT/junit-gpu.xml" >"$OUT/pytest-gpu.log" 2>&1
rc=$?
line=$(grep -E "[0-9]+ (passed|failed|skipped|error)" "$OUT/pytest-gpu.log" | tail -1)
note "tests (rc $rc, $(($(date +%s) - start)) s): ${line:-no pytest summary line, see pytest-gpu.log}"
if [ "$rc" -ne 0 ] || ! grep -q " passed" <<<"$line" || grep -q "skipped" <<<"$line"; then
    status=1
fi

# 2. Throughput: vLLM one document at a time versus the pipeline, same documents.
start=$(date +%s)
timeout "$BENCH_TIMEOUT" "$PYTHON" scripts/bench_process.py --backend vllm --model "$MODEL" \
    --docs "$DOCS" --corpus "$OUT/corpus" --json "$OUT/bench-process-vllm.json" \
    >"$OUT/bench-process-vllm.log" 2>&1
rc=$?
note "throughput (rc $rc, $(($(date +%s) - start)) s):"
grep -E "^corpus:|^  \(a\)|^  \(b\)|model busy|ratio|best" "$OUT/bench-process-vllm.log" | tee -a "$SUMMARY"
[ "$rc" -eq 0 ] || status=1
rm -rf "$OUT/corpus"

note "uptime: $(uptime)"
note "gpu_check: $([ "$status" -eq 0 ] && echo PASS || echo FAIL) (logs in $OUT)"
exit "$status"
