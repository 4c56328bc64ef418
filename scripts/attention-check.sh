#!/usr/bin/env bash
# The attention parity check: context-parallel ring attention (cp=4) on CPU ranks for a realistic shape, with the
# backend-selection report and the parity against the single-rank fp64 reference; on a machine with a GPU, also the
# GPU parity of the default backend. Extra arguments go to `ringtrain attention-check`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/setup.sh"
bin=${RINGTRAIN_BUILD_DIR:-$root/build}/ringtrain
"$bin" attention-check --device cpu --cp 4 --comm ring --seq 4096 --heads 8 --kv-heads 2 --head-dim 64 --causal "$@"
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  "$bin" attention-check --device cuda --cp 1 --seq 4096 --heads 8 --kv-heads 2 --head-dim 128 --causal --dtype bf16
fi
