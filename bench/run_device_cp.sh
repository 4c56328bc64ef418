#!/usr/bin/env bash
# Context parallelism on the two-GPU machine (nvidia-h200-x2): the NCCL and CP parity tests, the CLI parity check,
# then `ringtrain bench cp` and PyTorch's context_parallel on the same shapes in the same job.
#   bench/run_device_cp.sh BIN_DIR     (BIN_DIR holds ringtrain and the test programs of a CUDA build)
#   OUT=DIR  logs and JSON are written there
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build-device}
out=${OUT:-/tmp}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
py_pkg() { python3 -c "import nvidia.$1 as m; print(m.__path__[0])" 2>/dev/null || true; }
export LD_LIBRARY_PATH=$(py_pkg cudnn)/lib:$(py_pkg nccl)/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
status=0
step() { echo "== $*"; "$@" 2>&1 | tee -a "$out/cp-device.log" | grep -vE '^\[ +(RUN|OK) +\]|^\[seed'; local rc=${PIPESTATUS[0]}; [ "$rc" -eq 0 ] || { echo "!! exit $rc: $*"; status=1; }; }
step timeout 60 "$bin/test_core" --gtest_filter='HashedNormal*'
step timeout 120 "$bin/test_comm_gpu"
step timeout 60 "$bin/test_cp_gpu"
step timeout 300 "$bin/test_check_gpu"
step timeout 120 "$bin/ringtrain" attention-check --device cuda --cp 2 --seq 8191 --heads 8 --kv-heads 2 \
  --head-dim 128 --causal --dtype bf16 --backends cudnn,flash
# The bars' comparison: our best backend and PyTorch's, 20 timed runs after 3 warm-ups on both sides.
step timeout 240 "$bin/ringtrain" bench cp --cp 2 --seq 32768,131072 --backends cudnn --causal --iters 20 \
  --warmup 3 --json "$out/ours_cp.json"
step timeout 300 python3 -m torch.distributed.run --standalone --nproc_per_node=2 bench/compare_torch_cp.py \
  --seq 32768,131072 --iters 20 --warmup 3 --ours "$out/ours_cp.json"
step timeout 200 "$bin/ringtrain" bench cp --cp 2 --seq 32768,131072 --backends flash --causal --iters 3 --warmup 1
# The other ways to move KV, with our best backend (scaling efficiency comes from the ring rows above).
for comm in allgather a2a; do
  step timeout 200 "$bin/ringtrain" bench cp --cp 2 --seq 32768,131072 --backends cudnn --comm "$comm" --causal \
    --no-single
done
step timeout 200 "$bin/ringtrain" bench cp --cp 2 --seq 262144 --backends cudnn,flash,efficient --causal --iters 1 \
  --warmup 0 --no-single
exit $status
