#!/usr/bin/env bash
# Builds everything and runs the whole test suite (GPU tests skip with their reason where there is no GPU), then
# the CPU code again with AddressSanitizer + UndefinedBehaviorSanitizer (scripts/test-sanitized.sh): the CPU tests
# and the bad-input corpus through the sanitized binary. RINGTRAIN_SANITIZED=0 skips the second part.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/setup.sh"
ctest --test-dir "${RINGTRAIN_BUILD_DIR:-$root/build}" --output-on-failure --timeout 900 -j"$(nproc)" "$@"
[ "${RINGTRAIN_SANITIZED:-1}" = 0 ] || "$root/scripts/test-sanitized.sh"
