#!/usr/bin/env python3
"""Scoring from Python on one GPU: get_logprobs and get_reference_logprobs of one sequence fed as NumPy arrays (read
into host memory, results back as NumPy) and as PyTorch CUDA tensors (read in place, results written on the GPU), on
the same GPU worker in the same process, timed as wall time around the call (CUDA work complete when it returns),
medians after warm-up. The reference call is timed after one train step, when it swaps the reference weights in and
rewrites the trained ones from the optimizer's master shards. Llama-3.2-1B shape, random weights (builtin), bf16.

  PYTHONPATH=PKG_DIR python3 bench/compare_python_scoring.py --seq 8192
"""
import argparse
import statistics
import time

import numpy as np


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    a = p.parse_args()
    import torch

    import ringtrain

    cfg = {"policy": {"model_name": "builtin:llama-3.2-1b", "train_global_batch_size": 1, "train_micro_batch_size": 1,
                      "logprob_batch_size": 1, "max_total_sequence_length": a.seq, "precision": "bfloat16"},
           "loss_fn": {"type": "nll"}, "device": "cuda", "train": {"seed": 1}}
    worker = ringtrain.PolicyWorker(cfg)
    vocab = worker.model_config["vocab_size"]
    ids = np.random.default_rng(1).integers(0, vocab, (1, a.seq))
    batches = {"numpy": {"input_ids": ids}, "cuda": {"input_ids": torch.from_numpy(ids).cuda()}}

    def timed(f):
        for _ in range(a.warmup):
            f()
        ms = []
        for _ in range(a.calls):
            torch.cuda.synchronize()
            t = time.perf_counter()
            f()
            ms.append((time.perf_counter() - t) * 1e3)
        return statistics.median(ms)

    got = {}
    for kind, batch in batches.items():
        got[kind] = worker.get_logprobs(batch)["logprobs"]
        print(f"get_logprobs, {a.seq} tokens, inputs as {kind:5s}: {timed(lambda: worker.get_logprobs(batch)):8.2f} ms"
              f" (median of {a.calls} after {a.warmup})", flush=True)
    same = np.array_equal(got["cuda"].cpu().numpy(), got["numpy"])
    print(f"results equal bit for bit: {same}")
    worker.train({"input_ids": ids, "input_lengths": [a.seq]})
    for kind, batch in batches.items():
        print(f"get_reference_logprobs after a step, inputs as {kind:5s}: "
              f"{timed(lambda: worker.get_reference_logprobs(batch)):8.2f} ms", flush=True)
    print(f"get_logprobs after a step, inputs as cuda : {timed(lambda: worker.get_logprobs(batches['cuda'])):8.2f} ms")


if __name__ == "__main__":
    main()
