#!/usr/bin/env bash
# The main job: GRPO on the built-in task (reverse 3-5 digits) with a tiny policy that the run initialises
# (configs/grpo_tiny.yaml, on the CPU): an SFT warm-up on the reference answers, then GRPO with a progress line; at
# the end the reward curves (reward.svg) and the first-10 / last-10 step summary. Everything goes to runs/grpo_tiny
# (RINGTRAIN_RUN_DIR), which each run starts afresh. Extra arguments are config overrides (e.g. train.seed=2).
# The attention parity check is scripts/attention-check.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/setup.sh"
bin=${RINGTRAIN_BUILD_DIR:-$root/build}/ringtrain
out=${RINGTRAIN_RUN_DIR:-$root/runs/grpo_tiny}
# Only a previous run's folder (or an empty one) is cleared.
if [ -e "$out" ]; then
  if [ -f "$out/metrics.jsonl" ] || [ -z "$(ls -A "$out")" ]; then
    rm -rf "$out"
  else
    echo "run.sh: $out exists and is not a previous run's folder; set RINGTRAIN_RUN_DIR elsewhere" >&2
    exit 1
  fi
fi
cd "$root"
start=$(date +%s%N)
"$bin" grpo --config configs/grpo_tiny.yaml train.metrics_dir="$out" train.checkpoint_dir="$out/checkpoints" "$@"
ms=$((($(date +%s%N) - start) / 1000000))
printf 'run time: %d.%01d s (the build excluded)\n' $((ms / 1000)) $((ms % 1000 / 100))
