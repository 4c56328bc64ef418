#!/usr/bin/env bash
# The attention benchmarks on the GPU machine: ringtrain's backends against PyTorch's SDPA backends on the bar's
# shapes (bf16, H=32, D=128, causal; B=1 S=16384 and 32768, B=4 S=4096), then the GPU math reference's rate.
#   bench/run_device_bench.sh BUILD_DIR        (scripts/device-check.sh calls it with BENCH=1)
#   OUT=DIR   bench.json is written there
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-device}
out=${OUT:-/tmp}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader || true
python3 bench/compare_torch.py --ringtrain "$build/ringtrain" --shapes 1x16384,1x32768,4x4096 --heads 32 \
  --head-dim 128 --causal --dtype bf16 --backends "${BENCH_BACKENDS:-cudnn,flash,efficient}" --iters 10 --warmup 3 \
  --json "$out/bench.json"
# The GPU reference (materialised fp32 scores): slow by design, timed once for the record.
"$build/ringtrain" bench attention --backends math --batch 4 --seq 4096 --heads 32 --head-dim 128 --causal \
  --iters 3 --warmup 1
