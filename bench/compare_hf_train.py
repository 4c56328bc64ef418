#!/usr/bin/env python3
"""Full training-step throughput of ringtrain (`ringtrain bench train`) against Hugging Face transformers, same
shapes, same job.

The Hugging Face side (one GPU), the precision recipe of ringtrain's: LlamaForCausalLM from a LlamaConfig of the
benchmark shape (random init) with fp32 parameters, forward under bf16 autocast (SDPA attention, no activation
checkpointing), the loss from labels (mean next-token cross-entropy), backward, clip_grad_norm_(1.0),
torch.optim.AdamW(fused=True) step, zero_grad; warm-up steps, then the median of timed steps between CUDA events.
An out-of-memory error is reported as OOM. Then the model is freed and `ringtrain bench train` runs on the same
shapes (its BENCH_TRAIN lines are parsed): bf16 weights, fp32 gradients, fp32 master weights and moments sharded
over the cp GPUs.

FLOPs per step as bench/compare_hf_model.py counts them (6*N*S + 6*L*S^2*heads*head_dim); MFU against 989 TFLOP/s.

  python3 bench/compare_hf_train.py --bin build/ringtrain --seq 8192 [--cp 1,2] [--loss nll]
"""
import argparse
import json

from compare_hf_model import (PEAK, add_shape_args, cuda_median_ms, describe, hf_llama, run_bench, shape_options,
                              step_flops)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", required=True, help="the ringtrain executable")
    p.add_argument("--seq", default="8192", help="comma-separated sequence lengths")
    p.add_argument("--cp", default="1", help="comma-separated cp sizes for ringtrain (HF runs on one GPU)")
    p.add_argument("--loss", default="nll", help="ringtrain's loss: nll or pg (HF: its cross-entropy)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    add_shape_args(p)
    p.add_argument("--json", default=None, help="write all rows here")
    return p.parse_args()


def time_hf(a, seqs):
    import torch

    model = hf_llama(a, max(seqs) * 2, torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.01, fused=True)
    rows = []
    for seq in seqs:
        row = {"seq": seq, "side": "hf"}
        ids = torch.randint(0, a.vocab, (1, seq), device="cuda")

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)

        try:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            ms = cuda_median_ms(step, a.warmup, a.steps)
            row.update(status="ok", step_ms=ms, tokens_per_s=seq / (ms * 1e-3),
                       mfu=step_flops(a, seq) / (ms * 1e-3) / PEAK, peak_gib=torch.cuda.max_memory_allocated() / 2**30)
        except torch.cuda.OutOfMemoryError:
            row.update(status="OOM")
            opt.zero_grad(set_to_none=True)
        except RuntimeError as ex:
            row.update(status="failed: " + str(ex).split("\n")[0][:200])
            opt.zero_grad(set_to_none=True)
        print("HF %s" % json.dumps(row), flush=True)
        rows.append(row)
    del model, opt
    torch.cuda.empty_cache()
    return rows


def run_ours(a, seq, cp):
    cmd = [a.bin, "bench", "train"] + shape_options(a) + ["--seq", str(seq), "--cp", str(cp), "--loss", a.loss,
                                                          "--steps", str(a.steps), "--warmup", str(a.warmup)]
    rows, returncode = run_bench(cmd, "BENCH_TRAIN")
    if not rows:
        return {"seq": seq, "cp": cp, "side": "ringtrain", "status": "no result (exit code %d)" % returncode}
    rows[0].update(side="ringtrain", status="ok")
    return rows[0]


def main():
    a = parse_args()
    seqs = [int(s) for s in a.seq.split(",")]
    cps = [int(c) for c in a.cp.split(",")]
    print(describe(a), flush=True)
    hf = {r["seq"]: r for r in time_hf(a, seqs)}
    ours = [run_ours(a, seq, cp) for seq in seqs for cp in cps]

    print("\n%8s %4s %12s %7s %9s | %12s %7s %9s | %s" % ("S", "cp", "ours tok/s", "MFU", "peak GiB", "HF tok/s",
                                                          "MFU", "peak GiB", "ours/HF per GPU"))
    for r in ours:
        h = hf.get(r["seq"], {"status": "not run"})
        left = ("%12.0f %6.1f%% %9.1f" % (r["tokens_per_s"], 100 * r["mfu"], r["peak_pool_gib"]) if r["status"] == "ok"
                else "%30s" % r["status"][:30])
        right = ("%12.0f %6.1f%% %9.1f" % (h["tokens_per_s"], 100 * h["mfu"], h["peak_gib"]) if h["status"] == "ok"
                 else "%30s" % h["status"][:30])
        ratio = ("%.2fx" % (r["tokens_per_s"] / r["cp"] / h["tokens_per_s"])
                 if r["status"] == "ok" and h["status"] == "ok" else "-")
        print("%8d %4d %s | %s | %s" % (r["seq"], r["cp"], left, right, ratio))
        if r["status"] == "ok":
            print("%8s phases (ms): %s" % ("", ", ".join("%s %.2f" % (p["phase"], p["ms"]) for p in r["phases_ms"])))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"hf": list(hf.values()), "ringtrain": ours}, f, indent=1)


if __name__ == "__main__":
    main()
