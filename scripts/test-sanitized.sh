#!/usr/bin/env bash
# The CPU build with -fsanitize=address,undefined -fno-sanitize-recover=all at -O1 (its own build folder,
# RINGTRAIN_ASAN_BUILD_DIR, default build-asan/), then the CPU tests and the bad-input corpus (tests/bad_inputs/)
# through it. Any sanitizer report fails the test that triggered it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${RINGTRAIN_ASAN_BUILD_DIR:-$root/build-asan}
cmake -S "$root" -B "$build" -G Ninja -DRINGTRAIN_CUDA=OFF -DRINGTRAIN_SANITIZE=ON -DRINGTRAIN_GPU_TESTS=OFF \
  -DCMAKE_PREFIX_PATH="$root/.deps/root/usr" >"$build.configure.log" 2>&1 || { cat "$build.configure.log"; exit 1; }
ninja -C "$build" -j"$(nproc)"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1
# The GPU test programs are not built here (they would only skip): the main build runs them.
ctest --test-dir "$build" --output-on-failure --timeout 900 -j"$(nproc)" "$@"
