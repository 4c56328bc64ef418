#!/usr/bin/env bash
# Training on the device machine (one H200, or two for the cp=2 parts): the train and communicator GPU tests, then
# full training steps (forward, loss, backward, reduce-scatter, clip, AdamW, all-gather) against Hugging Face
# transformers + fused AdamW in the same job, with the ratio per GPU.
# The rollouts step times the policy worker on a rollout mix, packed against padded and long (docs/PERF.md).
#   bench/run_device_train.sh BIN_DIR [tests] [hf] [pg] [rollouts]   (default: all four; BIN_DIR holds a CUDA build)
#   OUT=DIR  logs and JSON are written there
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build-device}
shift || true
steps=${*:-tests hf pg rollouts}
out=${OUT:-/tmp}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
py_pkg() { python3 -c "import nvidia.$1 as m; print(m.__path__[0])" 2>/dev/null || true; }
export LD_LIBRARY_PATH=$(py_pkg cudnn)/lib:$(py_pkg nccl)/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,memory.used --format=csv,noheader
gpus=$(nvidia-smi -L | wc -l)
status=0
step() { echo "== $*"; "$@" 2>&1 | tee -a "$out/train-device.log" | grep -vE '^\[ +(RUN|OK) +\]|^\[seed'; local rc=${PIPESTATUS[0]}; [ "$rc" -eq 0 ] || { echo "!! exit $rc: $*"; status=1; }; }
has() { [[ " $steps " == *" $1 "* ]]; }
cps=1; [ "$gpus" -ge 2 ] && cps=1,2

if has tests; then
  step timeout 300 "$bin/test_train"
  [ -x "$bin/test_train_gpu" ] && step timeout 300 "$bin/test_train_gpu"
  step timeout 300 "$bin/test_comm_gpu"
fi
if has hf; then
  step timeout 580 python3 bench/compare_hf_train.py --bin "$bin/ringtrain" --seq 8192 --cp $cps --json "$out/train_vs_hf.json"
fi
if has pg; then
  step timeout 300 "$bin/ringtrain" bench train --seq 8192 --loss pg
  [ "$gpus" -ge 2 ] && step timeout 300 "$bin/ringtrain" bench train --seq 32768 --cp 2 --loss pg
fi
if has rollouts; then
  step timeout 580 "$bin/ringtrain" bench rollouts --json "$out/rollouts.json"
fi
exit $status
