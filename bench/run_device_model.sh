#!/usr/bin/env bash
# The GPU model on the device machine (one H200, or two for the cp=2 parts): the model tests, `logprobs --device cuda`
# against the CPU, then training-step throughput against Hugging Face transformers in the same job, and 128K tokens.
#   bench/run_device_model.sh BIN_DIR [tests] [cli] [hf] [long]   (default: all four; BIN_DIR holds a CUDA build)
#   OUT=DIR  logs and JSON are written there
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build-device}
shift || true
steps=${*:-tests cli hf long}
out=${OUT:-/tmp}
log=model-device.log
source bench/device_env.sh

if has tests; then
  step timeout 400 "$bin/test_model_gpu"
fi
if has cli; then  # bf16 on the GPU (one GPU, and cp=2 when there are two) against fp32 on the CPU: within 2e-2
  ck=tests/fixtures/model/llama/checkpoint
  python3 -c "import json; e=json.load(open('tests/fixtures/model/llama/expected.json'))
for s in e['sequences']: print(json.dumps({'input_ids': s}))" > "$out/lp_in.jsonl"
  step "$bin/ringtrain" logprobs --model $ck --data "$out/lp_in.jsonl" --out "$out/lp_cpu.jsonl"
  for cp in ${cps//,/ }; do
    step "$bin/ringtrain" logprobs --model $ck --data "$out/lp_in.jsonl" --device cuda --cp $cp --out "$out/lp_gpu$cp.jsonl"
    step python3 -c "import json,sys
a=[json.loads(l)['logprobs'] for l in open('$out/lp_cpu.jsonl')]; b=[json.loads(l)['logprobs'] for l in open('$out/lp_gpu$cp.jsonl')]
assert len(a)==len(b)>0, (len(a), len(b))
err=max(abs(x-y) for p,q in zip(a,b) for x,y in zip(p,q)) if all(len(p)==len(q) for p,q in zip(a,b)) else float('inf')
print('logprobs --device cuda --cp $cp vs cpu: max abs diff %.3g (bar 2e-2)' % err); sys.exit(0 if err <= 2e-2 else 1)"
  done
fi
if has hf; then
  step timeout 580 python3 bench/compare_hf_model.py --bin "$bin/ringtrain" --seq 8192,32768 --cp $cps \
    --json "$out/model_vs_hf.json"
fi
if has long; then
  if [ "$gpus" -ge 2 ]; then
    step timeout 300 "$bin/ringtrain" bench model --seq 131072 --cp 2 --iters 3 --warmup 1
    step timeout 300 "$bin/ringtrain" bench model --seq 131072 --cp 2 --checkpoint all --iters 3 --warmup 1
  fi
  step timeout 300 "$bin/ringtrain" bench model --seq 131072 --checkpoint all --iters 3 --warmup 1
fi
exit $status
