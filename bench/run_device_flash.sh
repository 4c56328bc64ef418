#!/usr/bin/env bash
# The flash kernels on the GPU machine: their correctness tests, compute-sanitizer on small cases, then flash and
# cudnn against PyTorch's SDPA backends (timed in the same run by bench/compare_torch.py) on the shapes of the flash
# bars: head dim 128 (B=1, H=32, S=16K and 32K) and head dim 64 (B=2, H=16, S=8K), causal and not.
#   bench/run_device_flash.sh BIN_DIR [STEPS]   STEPS: any of "test sanitize bench" (default: all three)
#   OUT=DIR   logs and bench_*.json are written there
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${1:?usage: bench/run_device_flash.sh BIN_DIR [STEPS]}
steps=${2:-test sanitize bench}
out=${OUT:-/tmp}
log=flash.log
source bench/device_env.sh
limit() { timeout --kill-after=10 "$@"; }  # a hung kernel ends the step, not the whole call

if has test; then
  step limit 420 "$bin/test_attention_gpu"
  step limit 300 "$bin/test_cp_gpu"
fi
if has sanitize && command -v compute-sanitizer >/dev/null; then
  small='FlashCuda.Bf16TopLeftMoreQueries:FlashCuda.PackedOddLengthsCausalGqa:FlashCuda.Fp16BottomRightFewerQueries'
  small+=':FlashCuda.PackedForwardIgnoresNanRowsPastTheSequences:FlashCuda.PackedRaggedBottomRightAccumulate'
  small+=':FlashCuda.NoMaskHeadDim128PackedAndGqa:WindowFlashCuda.*'
  step limit 300 compute-sanitizer --tool memcheck --error-exitcode 1 "$bin/test_attention_gpu" --gtest_filter="$small"
  racy='FlashCuda.PackedOddLengthsCausalGqa:FlashCuda.PackedForwardIgnoresNanRowsPastTheSequences'
  racy+=':WindowFlashCuda.Bf16Packed'
  step limit 300 compute-sanitizer --tool racecheck --error-exitcode 1 "$bin/test_attention_gpu" --gtest_filter="$racy"
fi
if has bench; then
  common=(--ringtrain "$bin/ringtrain" --dtype bf16 --backends "${BENCH_BACKENDS:-cudnn,flash}" --iters 10 --warmup 3)
  step limit 240 python3 bench/compare_torch.py "${common[@]}" --shapes 1x16384,1x32768 --heads 32 --head-dim 128 \
    --causal --json "$out/bench_d128_causal.json"
  step limit 240 python3 bench/compare_torch.py "${common[@]}" --shapes 1x16384,1x32768 --heads 32 --head-dim 128 \
    --json "$out/bench_d128.json"
  step limit 240 python3 bench/compare_torch.py "${common[@]}" --shapes 2x8192 --heads 16 --head-dim 64 --causal \
    --json "$out/bench_d64_causal.json"
  step limit 240 python3 bench/compare_torch.py "${common[@]}" --shapes 2x8192 --heads 16 --head-dim 64 \
    --json "$out/bench_d64.json"
fi
exit "$status"
