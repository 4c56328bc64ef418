#!/usr/bin/env python3
"""Counts the device-to-host copies of the Python module's calls on a GPU worker (builtin:tiny, bf16) fed NumPy
arrays or PyTorch CUDA tensors of the same values: one process per (method, input kind), each traced by
bench/kernel_trace.cpp (CUPTI), making the worker and then calling the method CALLS times; a process that only makes
the worker gives the baseline, so (copies - baseline) / CALLS is what one call costs. get_logprobs and
get_reference_logprobs on CUDA input_ids take the zero-copy path (the ids read in place, the results written on the
GPU); train on a batch of CUDA tensors too (the batch read in place, the losses on the device: only counts, verdicts
and the loss's sums come back).

  PYTHONPATH=PKG_DIR python3 bench/count_python_copies.py --trace-lib build/libringtrain_kernel_trace.so
"""
import argparse
import os
import subprocess
import sys
import tempfile

from kernel_trace_summary import copy_totals, read_trace

CALLS = 5
B, S = 4, 64
METHODS = ("get_logprobs", "get_reference_logprobs", "train")


def work(method, kind):
    import numpy as np
    import torch

    import ringtrain

    cfg = {"policy": {"model_name": "builtin:tiny", "train_global_batch_size": B, "train_micro_batch_size": 2,
                      "logprob_batch_size": B, "max_total_sequence_length": S, "precision": "bfloat16"},
           "loss_fn": {"type": "nll"}, "device": "cuda", "train": {"seed": 1}}
    worker = ringtrain.PolicyWorker(cfg)
    rng = np.random.default_rng(1)
    torch.cuda.synchronize()
    for _ in range(CALLS if method != "none" else 0):
        batch = {"input_ids": rng.integers(0, 256, (B, S)), "token_mask": rng.integers(0, 2, (B, S)) > 0}
        if kind == "cuda":
            batch = {k: torch.from_numpy(v).cuda() for k, v in batch.items()}
            torch.cuda.synchronize()
        out = getattr(worker, method)(batch)
        if method != "train":
            key = "logprobs" if method == "get_logprobs" else "reference_logprobs"
            assert (out[key].device.type if kind == "cuda" else "cpu") == ("cuda" if kind == "cuda" else "cpu")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace-lib", help="libringtrain_kernel_trace.so")
    p.add_argument("--work", nargs=2, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.work:
        return work(*a.work)
    if not a.trace_lib:
        p.error("--trace-lib is required")
    counts = {}
    with tempfile.TemporaryDirectory() as tmp:
        for method, kind in [("none", "numpy")] + [(m, k) for m in METHODS for k in ("numpy", "cuda")]:
            trace = os.path.join(tmp, f"{method}-{kind}.csv")
            env = dict(os.environ, CUDA_INJECTION64_PATH=os.path.abspath(a.trace_lib), RINGTRAIN_KERNEL_TRACE=trace)
            subprocess.run([sys.executable, os.path.abspath(__file__), "--work", method, kind], env=env, check=True)
            counts[method, kind] = copy_totals(read_trace(trace))["device->host"][:2]
    base_n, base_bytes = counts["none", "numpy"]
    print(f"input_ids int64 [{B}, {S}] = {B * S * 8} bytes, token_mask bool = {B * S} bytes; {CALLS} calls each; "
          f"making the worker alone: {base_n} device-to-host copies, {base_bytes} bytes")
    for method in METHODS:
        for kind in ("numpy", "cuda"):
            n, nbytes = counts[method, kind]
            print(f"{method:24s} inputs as {kind:5s}: {(n - base_n) / CALLS:6.1f} device-to-host copies per call, "
                  f"{(nbytes - base_bytes) / CALLS:9.1f} bytes per call")


if __name__ == "__main__":
    main()
