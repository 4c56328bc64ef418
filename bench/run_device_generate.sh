#!/usr/bin/env bash
# The GPU sampler on the device machine (one H200): the decode backend and sampler tests, `bench generate` against
# Hugging Face transformers' generate (static cache) in the same job, and the main GRPO job on the GPU.
#   bench/run_device_generate.sh BIN_DIR [tests] [grpo] [hf]   (default: all three; BIN_DIR holds a CUDA build)
#   OUT=DIR  logs and JSON are written there; HF_COMPILE: the HF runs, default off,auto (without compilation, then
#   transformers' own choice, which compiles the decoding step for a static cache)
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build-device}
shift || true
steps=${*:-tests grpo hf}
out=${OUT:-/tmp}
log=generate-device.log
source bench/device_env.sh

if has tests; then
  step timeout ${TEST_TIMEOUT:-120} "$bin/test_attention_gpu" --gtest_brief=1 --gtest_filter='DecodeCuda.*'
  step timeout ${TEST_TIMEOUT:-120} "$bin/test_model_gpu" --gtest_brief=1 --gtest_filter='*GpuSampl*'
fi
if has grpo; then  # the main job's config, shortened: the sampler decodes on the GPU
  step timeout ${GRPO_TIMEOUT:-200} "$bin/ringtrain" grpo --config configs/grpo_tiny.yaml train.steps=${GRPO_STEPS:-40} \
    train.metrics_dir="$out/grpo" train.checkpoint_dir=/tmp/grpo_checkpoints
fi
if has hf; then
  step timeout ${HF_TIMEOUT:-400} python3 bench/compare_hf_generate.py --bin "$bin/ringtrain" \
    --hf-compile "${HF_COMPILE:-off,auto}" --json "$out/generate_vs_hf.json"
fi
exit $status
