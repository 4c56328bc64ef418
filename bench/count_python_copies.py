#!/usr/bin/env python3
"""Counts the device-to-host copies that CUDA tensor inputs cost the Python module: the same GPU worker calls
(get_logprobs and train on builtin:tiny, bf16) run twice, in two processes traced by bench/kernel_trace.cpp (CUPTI),
once fed NumPy arrays and once fed PyTorch CUDA tensors of the same values; the difference between the two traces'
device-to-host copies is what reading CUDA inputs costs (the worker's own copies, its results, are in both).

  PYTHONPATH=PKG_DIR python3 bench/count_python_copies.py --trace-lib build/libringtrain_kernel_trace.so
"""
import argparse
import os
import subprocess
import sys
import tempfile

from kernel_trace_summary import copy_totals

CALLS = 5


def work(kind):
    import numpy as np
    import torch

    import ringtrain

    cfg = {"policy": {"model_name": "builtin:tiny", "train_global_batch_size": 4, "train_micro_batch_size": 2,
                      "logprob_batch_size": 4, "max_total_sequence_length": 64, "precision": "bfloat16"},
           "loss_fn": {"type": "nll"}, "device": "cuda", "train": {"seed": 1}}
    worker = ringtrain.PolicyWorker(cfg)
    rng = np.random.default_rng(1)
    for _ in range(CALLS):
        batch = {"input_ids": rng.integers(0, 256, (4, 64)), "token_mask": rng.integers(0, 2, (4, 64)) > 0}
        if kind == "cuda":
            batch = {k: torch.from_numpy(v).cuda() for k, v in batch.items()}
            torch.cuda.synchronize()
        worker.get_logprobs(batch)
        worker.train(batch)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace-lib", help="libringtrain_kernel_trace.so")
    p.add_argument("--work", choices=["numpy", "cuda"], help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.work:
        return work(a.work)
    if not a.trace_lib:
        p.error("--trace-lib is required")
    counts = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("numpy", "cuda"):
            trace = os.path.join(tmp, kind + ".csv")
            env = dict(os.environ, CUDA_INJECTION64_PATH=os.path.abspath(a.trace_lib), RINGTRAIN_KERNEL_TRACE=trace)
            subprocess.run([sys.executable, os.path.abspath(__file__), "--work", kind], env=env, check=True)
            counts[kind] = copy_totals(trace)["device->host"]
    for kind, (count, nbytes, _) in counts.items():
        print(f"inputs as {kind}: {count} device-to-host copies, {nbytes} bytes "
              f"({CALLS} get_logprobs + {CALLS} train calls)")
    extra = counts["cuda"][0] - counts["numpy"][0]
    extra_bytes = counts["cuda"][1] - counts["numpy"][1]
    print(f"CUDA inputs cost {extra} device-to-host copies ({extra_bytes} bytes) more than NumPy inputs: "
          f"{extra / (2 * CALLS):.1f} per call")


if __name__ == "__main__":
    main()
