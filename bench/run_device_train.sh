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
log=train-device.log
source bench/device_env.sh

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
