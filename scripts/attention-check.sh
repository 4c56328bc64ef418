#!/usr/bin/env bash
# The attention parity check: context-parallel ring attention (cp=4) on CPU ranks for a realistic shape, with the
# backend-selection report and the parity against the single-rank fp64 reference; on a machine with a GPU, also the
# GPU parity of the default backend. Extra arguments go to `ringtrain attention-check`; an option given there replaces
# the default below (`--comm allgather`, `--cp 3 --seq 1000`).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/setup.sh"
bin=${RINGTRAIN_BUILD_DIR:-$root/build}/ringtrain
declare -A defaults=([--device]=cpu [--cp]=4 [--comm]=ring [--seq]=4096 [--heads]=8 [--kv-heads]=2 [--head-dim]=64)
for arg in "$@"; do
  [[ $arg == --* ]] && unset "defaults[${arg%%=*}]"
  [[ $arg == --cp-comm* ]] && unset "defaults[--comm]"
done
args=()
for option in "${!defaults[@]}"; do args+=("$option" "${defaults[$option]}"); done
"$bin" attention-check "${args[@]}" --causal "$@"
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  "$bin" attention-check --device cuda --cp 1 --seq 4096 --heads 8 --kv-heads 2 --head-dim 128 --causal --dtype bf16
fi
