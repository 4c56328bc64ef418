# Sourced by bench/run_device_{model,train}.sh after they set `steps`, `out` and `log`: the device machine's
# environment (NCCL without NVLink multicast; cuDNN and NCCL from python's nvidia packages), the GPU line, and the
# step helpers. step CMD...: runs CMD, appends its output to $out/$log, prints it without gtest's RUN/OK lines, and
# sets status=1 when it fails. has NAME: whether NAME is among the requested steps.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
py_pkg() { python3 -c "import nvidia.$1 as m; print(m.__path__[0])" 2>/dev/null || true; }
export LD_LIBRARY_PATH=$(py_pkg cudnn)/lib:$(py_pkg nccl)/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
# The test programs run the ringtrain program of BIN_DIR (`bin`), not the build folder's path compiled into them.
if [ -n "${bin:-}" ]; then export RINGTRAIN_CLI=$(realpath "$bin")/ringtrain; fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,memory.used --format=csv,noheader
gpus=$(nvidia-smi -L | wc -l)
status=0
step() { echo "== $*"; "$@" 2>&1 | tee -a "$out/$log" | grep -vE '^\[ +(RUN|OK) +\]|^\[seed'; local rc=${PIPESTATUS[0]}; [ "$rc" -eq 0 ] || { echo "!! exit $rc: $*"; status=1; }; }
has() { [[ " $steps " == *" $1 "* ]]; }
cps=1; [ "$gpus" -ge 2 ] && cps=1,2
