#!/usr/bin/env python3
"""The Python module's overhead on a train step: the same config, checkpoint and rows trained by the C++ CLI
(`ringtrain train`, its per-step `step_seconds` from metrics.jsonl: the worker's train() alone) and by
`ringtrain.PolicyWorker.train` called from Python (wall time around the call: the batch read from NumPy arrays or
PyTorch CUDA tensors, the step, the result dict), in the same job on one GPU. Medians after warm-up steps. The GPU
runs at its power cap, and a later run is slower than an earlier one by a few per cent: the CLI runs before and
after the Python side (its median over both), and the NumPy and the CUDA-tensor workers train in alternation, step
by step, in one process.

The checkpoint is transformers' LlamaForCausalLM of the benchmark shape (random init, tied, bf16) saved with
save_pretrained, unless --model names a folder. Needs PyTorch and transformers, the ringtrain module on PYTHONPATH
(built for this interpreter: bench/build_python_module.sh for another Python than the build's).

  PYTHONPATH=PKG_DIR python3 bench/compare_python_train.py --bin build/ringtrain --seq 8192
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from compare_hf_model import add_shape_args, describe, hf_llama

SIDES = ("numpy", "torch_cuda")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", required=True, help="the ringtrain executable")
    p.add_argument("--seq", type=int, default=8192, help="tokens per step (one sequence)")
    p.add_argument("--steps", type=int, default=8, help="timed steps per side")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--model", default=None, help="a checkpoint folder (default: a random one of the shape options)")
    add_shape_args(p)
    p.add_argument("--json", default=None, help="write the figures here")
    return p.parse_args()


def save_random_checkpoint(a, folder):
    import torch

    model = hf_llama(a, a.seq, torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    del model
    torch.cuda.empty_cache()


def overrides(a, model, data, metrics):
    return [f"policy.model_name={model}", "device=cuda", "policy.precision=bfloat16",
            "policy.train_global_batch_size=1", "policy.train_micro_batch_size=1", "policy.logprob_batch_size=1",
            f"policy.max_total_sequence_length={a.seq}", "policy.scheduler.warmup_steps=0",
            f"train.data={data}", f"train.steps={a.warmup + a.steps}", "train.epochs=1", f"train.metrics_dir={metrics}",
            "train.checkpoint_dir=", "train.checkpoint_every=0"]


def time_cli(a, config, opts):
    cmd = [a.bin, "train", "--config", config, *opts, "--no-progress"]
    print("$ " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        sys.exit(proc.stdout[-4000:] + f"\nringtrain train failed ({proc.returncode})")
    metrics = [o.split("=", 1)[1] for o in opts if o.startswith("train.metrics_dir=")][0]
    with open(os.path.join(metrics, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r["step_seconds"] for r in rows[a.warmup:]]


def time_python(a, config, opts, rows):
    """{name: (wall times, worker times)} for the NumPy and the CUDA-tensor worker, stepping in alternation."""
    import ringtrain
    import torch

    workers = {name: ringtrain.PolicyWorker(config, opts(name)) for name in SIDES}
    times = {name: ([], []) for name in SIDES}
    for i, ids in enumerate(rows):
        for name, worker in workers.items():
            batch = {"input_ids": ids[None, :]}
            if name == "torch_cuda":
                batch = {"input_ids": torch.from_numpy(batch["input_ids"]).cuda()}
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            r = worker.train(batch)
            t = time.perf_counter() - t0
            if i >= a.warmup:
                times[name][0].append(t)
                times[name][1].append(r["seconds"])
    del workers
    return times


def main():
    a = parse_args()
    print(describe(a) + f", one sequence of {a.seq} tokens per step, bf16, NLL", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        model = a.model or os.path.join(tmp, "model")
        if not a.model:
            save_random_checkpoint(a, model)
        rng = np.random.default_rng(1)
        rows = [rng.integers(0, a.vocab, a.seq, dtype=np.int64) for _ in range(a.warmup + a.steps)]
        data = os.path.join(tmp, "rows.jsonl")
        with open(data, "w") as f:
            for r in rows:
                f.write(json.dumps({"input_ids": r.tolist()}) + "\n")
        config = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "sft.yaml")
        result = {"seq": a.seq, "steps": a.steps, "warmup": a.warmup}
        before = time_cli(a, config, overrides(a, model, data, tmp + "/cli"))
        times = time_python(a, config, lambda name: overrides(a, model, data, tmp + "/" + name), rows)
        after = time_cli(a, config, overrides(a, model, data, tmp + "/cli-after"))
        result["cli_step_s"] = statistics.median(before + after)
        result["cli_before_s"], result["cli_after_s"] = statistics.median(before), statistics.median(after)
        for name, (wall, inside) in times.items():
            result[name] = {"wall_s": statistics.median(wall), "worker_s": statistics.median(inside)}
    cli = result["cli_step_s"]
    print(f"CLI train step (worker time, median of 2 x {a.steps}): {1e3 * cli:.2f} ms (run before the Python side "
          f"{1e3 * result['cli_before_s']:.2f} ms, after it {1e3 * result['cli_after_s']:.2f} ms)")
    for name in SIDES:
        r = result[name]
        r["overhead_vs_cli"] = r["wall_s"] / cli - 1
        r["overhead_vs_own_worker_time"] = r["wall_s"] / r["worker_s"] - 1
        print(f"Python, batch as {name}: {1e3 * r['wall_s']:.2f} ms per train() call (worker {1e3 * r['worker_s']:.2f}"
              f" ms): {100 * r['overhead_vs_cli']:+.2f}% against the CLI, {100 * r['overhead_vs_own_worker_time']:+.2f}%"
              f" against its own worker time (bar: 2%)")
    print("PYTHON_TRAIN " + json.dumps(result))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
