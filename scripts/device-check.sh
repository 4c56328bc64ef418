#!/usr/bin/env bash
# On the GPU machine (see README, "GPU users"): configure and build with CUDA, run the tests, then the
# benchmarks when asked. cuDNN and NCCL come from python's nvidia packages there; the header-only
# dependencies from .deps (scripts/fetch-deps.sh, carried along).
#   TESTS=REGEX  ctest -R filter (default: all tests)      LABELS=REGEX  ctest -L filter (e.g. _gpu)
#   BENCH=1      also run the benchmarks
#   OUT=DIR      logs are copied there when set            TARGETS="a b"  build only these ninja targets
set -euo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
py_pkg() { python3 -c "import nvidia.$1 as m; print(m.__path__[0])" 2>/dev/null || true; }
CUDNN_ROOT=${CUDNN_ROOT:-$(py_pkg cudnn)}
NCCL_ROOT=${NCCL_ROOT:-$(py_pkg nccl)}
# /usr/local/cuda/lib64 too: the cuDNN frontend dlopens the unversioned libcudart.so.
export LD_LIBRARY_PATH=${CUDNN_ROOT:+$CUDNN_ROOT/lib:}${NCCL_ROOT:+$NCCL_ROOT/lib:}/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
build=${BUILD_DIR:-build-device}
log=${OUT:-/tmp}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
cmake -S . -B "$build" -G Ninja -DRINGTRAIN_CUDA=ON -DCMAKE_PREFIX_PATH="$PWD/.deps/root/usr" \
  ${CUDNN_ROOT:+-DCUDNN_ROOT="$CUDNN_ROOT"} ${NCCL_ROOT:+-DNCCL_ROOT="$NCCL_ROOT"} > "$log/configure.log" 2>&1 \
  || { tail -40 "$log/configure.log"; exit 1; }
grep "ringtrain:" "$log/configure.log" || true
ninja -C "$build" ${TARGETS:-} 2>&1 | tee "$log/build.log" | grep -E "error|warning: .*(spill|stack)|FAILED" || true
[ "${PIPESTATUS[0]}" -eq 0 ] || { tail -40 "$log/build.log"; exit 1; }
ctest --test-dir "$build" --output-on-failure --timeout 600 ${LABELS:+-L "$LABELS"} -R "${TESTS:-.}" 2>&1 | tee "$log/ctest.log" | tail -60
tests_rc=${PIPESTATUS[0]}
# The benchmarks run even when a test failed (device time is scarce); the exit status is still the tests'.
if [ "${BENCH:-0}" = 1 ] && [ -x bench/run_device_bench.sh ]; then
  bench/run_device_bench.sh "$build" 2>&1 | tee "$log/bench.log" || echo "benchmarks failed (see bench.log)"
fi
exit "$tests_rc"
