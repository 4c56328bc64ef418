#!/usr/bin/env python3
"""PyTorch's context-parallel ring attention (torch.distributed.tensor.experimental.context_parallel) on the shapes
of `ringtrain bench cp`, in the same job, and the ours/PyTorch ratios.

Run with one process per GPU (torchrun). bf16, [B, H, S, D], forward+backward with o.backward(ones), timed as
follows: 2 warm-ups, then the median of 5 runs (--warmup, --iters), each
ended by a device synchronize; per-GPU TFLOP/s = 3.5 * 4*B*H*S*S*D (/2 causal) / cp / time. With --ours (the JSON of
`ringtrain bench cp --json`), rank 0 prints ringtrain's rows beside PyTorch's best and its flash, per length.
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.experimental import context_parallel
from torch.nn.attention import SDPBackend, sdpa_kernel

ap = argparse.ArgumentParser()
ap.add_argument("--seq", default="32768,131072")
ap.add_argument("--heads", type=int, default=32)
ap.add_argument("--head-dim", type=int, default=128)
ap.add_argument("--backends", default="FLASH_ATTENTION,CUDNN_ATTENTION,EFFICIENT_ATTENTION")
ap.add_argument("--ours", help="JSON rows of `ringtrain bench cp --json`")
ap.add_argument("--warmup", type=int, default=2, help="as `ringtrain bench cp --warmup`")
ap.add_argument("--iters", type=int, default=5, help="timed runs, median (as `ringtrain bench cp --iters`)")
args = ap.parse_args()

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
dist.init_process_group("nccl")
mesh = init_device_mesh("cuda", (world,), mesh_dim_names=("cp",))


def median_ms(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    ts = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


B, H, D = 1, args.heads, args.head_dim
ours = json.load(open(args.ours)) if args.ours else []
torch_rows = {}


def print_comparison(S):
    """ringtrain's rows at S beside PyTorch's flash and best (PyTorch's EFFICIENT runs after this: at long S it
    corrupts the CUDA context)."""
    if rank != 0:
        return
    fmt = lambda x: "%.0f" % x if x else "n/a"
    ratio = lambda a, b: "%.2f" % (a / b) if a and b else "n/a"
    flash = torch_rows.get((S, "FLASH_ATTENTION"))
    cands = [(v, n) for (s, n), v in torch_rows.items() if s == S and v]
    best = max(cands) if cands else (None, "-")
    for r in ours:
        if r["seq"] != S:
            continue
        print("ours S=%d %-6s %5.0f TFLOP/s/GPU (efficiency %.3f) | torch flash %s, best %s (%s) | ours/flash %s, "
              "ours/best %s" % (S, r["backend"], r["tflops_per_gpu"], r["efficiency"], fmt(flash), fmt(best[0]),
                                best[1], ratio(r["tflops_per_gpu"], flash), ratio(r["tflops_per_gpu"], best[0])),
              flush=True)


names = args.backends.split(",")
names.sort(key=lambda n: n == "EFFICIENT_ATTENTION")  # last: it can crash the process at long S
for S in [int(s) for s in args.seq.split(",")]:
    flops = 3.5 * 4 * B * H * S * S * D / 2
    for name in names:
        if name == "EFFICIENT_ATTENTION":
            print_comparison(S)
            if S > 65536:  # measured 2026-11-30 (docs/PERF.md): illegal memory access, then a hung peer
                if rank == 0:
                    print("torch CP=%d S=%d %s skipped: crashes above 65536 keys" % (world, S, name))
                continue
        be = getattr(SDPBackend, name)
        torch.manual_seed(0)
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        try:
            with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
                ql, kl, vl = (t.detach().requires_grad_() for t in (q, k, v))

                def fwd_bwd():
                    with sdpa_kernel([be]):
                        o = F.scaled_dot_product_attention(ql, kl, vl, is_causal=True)
                    o.backward(torch.ones_like(o))

                t = median_ms(fwd_bwd, args.warmup, args.iters)
            tf = flops / world / t / 1e9
            torch_rows[(S, name)] = tf
            if rank == 0:
                print("torch CP=%d S=%d %s fwd+bwd %.2f ms  %.0f TFLOP/s per GPU" % (world, S, name, t, tf), flush=True)
        except Exception as ex:
            torch_rows[(S, name)] = None
            if rank == 0:
                print("torch CP=%d S=%d %s FAILED: %s" % (world, S, name, str(ex).replace("\n", " ")[:200]), flush=True)
            # The CUDA context is unusable after an illegal access and NCCL's watchdog would abort: leave now, the
            # failure is the measurement (PyTorch's known EFFICIENT bug at long S).
            os._exit(0)
        del q, k, v
        torch.cuda.empty_cache()
    if "EFFICIENT_ATTENTION" not in names:
        print_comparison(S)
dist.destroy_process_group()
