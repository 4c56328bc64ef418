#!/usr/bin/env python3
"""Times ringtrain's attention backends and PyTorch's SDPA backends (FLASH, EFFICIENT, CUDNN) on the same
shapes in the same run, and prints our/PyTorch throughput ratios.

ringtrain is timed by its own CLI (`ringtrain bench attention --json`), PyTorch here, both with CUDA events,
warm-up and the median of the timed iterations. FLOPs:
4*B*H*S*S*D for the forward, halved when causal; forward+backward counts 3.5x the forward. PyTorch's
forward+backward is `o = sdpa(q, k, v); o.backward(dO)` (autograd included); its tensors are
[B, H, S, D] contiguous; ringtrain's are [B, S, H, D].
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ringtrain", required=True, help="path to the ringtrain binary")
    ap.add_argument("--shapes", default="1x16384,1x32768,4x4096", help="BxS list, comma-separated")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--backends", default="cudnn,flash", help="ringtrain backends to time")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", help="write all numbers here")
    return ap.parse_args()


def flops_fwd(b, h, s, d, causal):
    return 4.0 * b * h * s * s * d / (2 if causal else 1)


def run_ringtrain(a, batch, seqs):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    cmd = [a.ringtrain, "bench", "attention", "--backends", a.backends, "--seq", ",".join(map(str, seqs)),
           "--batch", str(batch), "--heads", str(a.heads), "--head-dim", str(a.head_dim), "--dtype", a.dtype,
           "--iters", str(a.iters), "--warmup", str(a.warmup), "--json", path] + (["--causal"] if a.causal else [])
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    with open(path) as f:
        rows = json.load(f)["rows"]
    os.unlink(path)
    return rows


def time_torch(a, batch, s):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float16

    def median_ms(fn):
        for _ in range(a.warmup):
            fn()
        torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ts = []
        for _ in range(a.iters):
            start.record()
            fn()
            stop.record()
            torch.cuda.synchronize()
            ts.append(start.elapsed_time(stop))
        ts.sort()
        return ts[len(ts) // 2]

    q, k, v = (torch.randn(batch, a.heads, s, a.head_dim, device="cuda", dtype=dt, requires_grad=True) for _ in range(3))
    do = torch.randn(batch, a.heads, s, a.head_dim, device="cuda", dtype=dt)
    fl = flops_fwd(batch, a.heads, s, a.head_dim, a.causal)
    out = {}
    for be in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION):
        try:
            with sdpa_kernel([be]):
                f = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=a.causal)
                tf = median_ms(f)

                def fb():
                    f().backward(do)

                tfb = median_ms(fb)
            out[be.name] = {"fwd_ms": tf, "fwd_tflops": fl / tf / 1e9, "fwdbwd_ms": tfb,
                            "fwdbwd_tflops": 3.5 * fl / tfb / 1e9}
        except Exception as ex:  # a backend PyTorch cannot run on this shape
            out[be.name] = {"error": str(ex)[:200]}
    del q, k, v, do
    torch.cuda.empty_cache()
    return out


# The PyTorch SDPA backend each of ours is compared with (the ratio column); others against FLASH.
TORCH_PEER = {"cudnn": "CUDNN", "flash": "FLASH", "efficient": "EFFICIENT"}


def main():
    a = parse_args()
    shapes = []
    for item in a.shapes.split(","):
        b, s = item.lower().split("x")
        shapes.append((int(b), int(s)))
    ours = {}
    for batch in sorted({b for b, _ in shapes}):
        seqs = [s for b, s in shapes if b == batch]
        for r in run_ringtrain(a, batch, seqs):
            ours[(batch, r["seq"], r["backend"])] = r
    torch_rows = {}
    for b, s in shapes:
        torch_rows[(b, s)] = time_torch(a, b, s)

    def tf(r, key):
        return r.get(key, 0.0) if r and r.get("status", "ok") == "ok" and "error" not in r else 0.0

    print("\nTFLOP/s (fwd / fwd+bwd), %s, H=%d, D=%d, %s; ratio = ours / PyTorch" %
          (a.dtype, a.heads, a.head_dim, "causal" if a.causal else "no mask"))
    ours_names = a.backends.split(",")
    head = "%-10s" % "B x S"
    for n in ours_names:
        head += " | %-15s" % ("ours " + n)
    for n in ("CUDNN", "FLASH", "EFFICIENT"):
        head += " | %-15s" % ("torch " + n)
    for n in ours_names:
        head += " | %-19s" % ("%s/torch %s" % (n, TORCH_PEER.get(n, "FLASH")))
    print(head)
    print("-" * len(head))
    table = []
    for b, s in shapes:
        line = "%-10s" % ("%dx%d" % (b, s))
        entry = {"batch": b, "seq": s, "ours": {}, "torch": torch_rows[(b, s)], "ratios": {}}
        for n in ours_names:
            r = ours.get((b, s, n), {})
            entry["ours"][n] = r
            line += " | %6.0f / %6.0f" % (tf(r, "fwd_tflops"), tf(r, "fwdbwd_tflops"))
        for n in ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION"):
            r = torch_rows[(b, s)].get(n, {})
            line += " | %6.0f / %6.0f" % (tf(r, "fwd_tflops"), tf(r, "fwdbwd_tflops"))
        for n in ours_names:
            ref = torch_rows[(b, s)].get(TORCH_PEER.get(n, "FLASH") + "_ATTENTION", {})
            o = ours.get((b, s, n), {})
            rf = tf(o, "fwd_tflops") / tf(ref, "fwd_tflops") if tf(ref, "fwd_tflops") else 0.0
            rb = tf(o, "fwdbwd_tflops") / tf(ref, "fwdbwd_tflops") if tf(ref, "fwdbwd_tflops") else 0.0
            entry["ratios"][n] = {"fwd": rf, "fwdbwd": rb}
            line += " | %7.3f / %7.3f  " % (rf, rb)
        print(line)
        table.append(entry)
    for (b, s, n), r in sorted(ours.items()):
        if r.get("status") != "ok":
            print("ours %s at %dx%d did not run: %s" % (n, b, s, r.get("status")))
    for (b, s), rows in torch_rows.items():
        for n, r in rows.items():
            if "error" in r:
                print("torch %s at %dx%d failed: %s" % (n, b, s, r["error"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "table": table}, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
