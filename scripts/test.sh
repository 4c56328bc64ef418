#!/usr/bin/env bash
# Builds everything and runs the whole test suite (GPU tests skip with their reason where there is no GPU).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/setup.sh"
ctest --test-dir "${RINGTRAIN_BUILD_DIR:-$root/build}" --output-on-failure --timeout 900 -j"$(nproc)" "$@"
