#!/usr/bin/env bash
# Ctrl-C to `ringtrain train` on a GPU (PERF.md row S): the run relaunches itself through `ringtrain launch`; SIGINT to
# that launcher 0.3 s after the step-20 checkpoint must stop the rank at its next microbatch (the launcher's SIGTERM),
# the launcher ending with 130, the run saving the steps it finished and naming the step it stopped in and that
# checkpoint as the one --resume continues from.
# Usage: bench/check_gpu_stop.sh BIN_DIR (the folder holding the ringtrain program). Exit 0 when all of that holds.
set -u
set -m  # the run in a process group of its own: a script's background job would otherwise ignore SIGINT
bin=${1:?usage: bench/check_gpu_stop.sh BIN_DIR}/ringtrain
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
python3 -c "
import json, random
with open('$d/data.jsonl', 'w') as f:
    for i in range(64):
        n = random.randint(200, 500)
        f.write(json.dumps({'input_ids': [random.randrange(256) for _ in range(n)], 'token_mask': [0] + [1] * (n - 1)}) + '\n')
"
"$bin" train --config configs/sft.yaml device=cuda policy.precision=bfloat16 --no-progress train.data="$d/data.jsonl" \
  train.checkpoint_dir="$d/ck" train.metrics_dir="$d/m" train.steps=100000 train.epochs=100000 \
  policy.scheduler.total_steps=100000 train.checkpoint_every=20 policy.max_total_sequence_length=512 >"$d/log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do [ -f "$d/ck/step_20/trainer_state.json" ] && break; sleep 0.1; done
sleep 0.3
kill -INT "$pid"
wait "$pid"
rc=$?
tail -5 "$d/log"
records=$(wc -l <"$d/m/metrics.jsonl")
echo "launcher exit $rc; metrics records $records; checkpoints: $(ls "$d/ck" | tr '\n' ' ')"
[ "$rc" = 130 ] && grep -q "stopped in step $((records + 1)) of 100000, which changed nothing" "$d/log" &&
  grep -q -- "--resume continues from $d/ck/step_$records\$" "$d/log"  # train.checkpoint_on_stop saved them all
