#!/usr/bin/env python3
"""Training-step throughput of ringtrain's GPU model against Hugging Face transformers, same shapes, same job.

The Hugging Face side (one GPU): LlamaForCausalLM from a LlamaConfig of the benchmark shape (random init, bf16,
SDPA attention, no activation checkpointing), one step = forward with labels (transformers' mean next-token
cross-entropy, i.e. minus the mean token logprob, computed from fp32-upcast logits) + backward + zero_grad; warm-up
steps, then the median of timed steps between CUDA events. An out-of-memory error is reported as OOM.
Then the model is freed and `ringtrain bench model` runs on the same shapes (its BENCH_MODEL lines are parsed).

FLOPs per step, for both: 6*N*S + 6*L*S^2*(heads*head_dim), N = matmul weights
(per layer q,k,v,o and the three MLP matrices; the LM head once). MFU against 989 TFLOP/s per GPU.

  python3 bench/compare_hf_model.py --bin build/ringtrain --seq 8192,32768 [--cp 1,2] [--checkpoint none]
"""
import argparse
import json
import subprocess
import sys

PEAK = 989e12


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", required=True, help="the ringtrain executable")
    p.add_argument("--seq", default="8192,32768", help="comma-separated sequence lengths")
    p.add_argument("--hf-seq", default=None, help="lengths for the HF side (default: --seq)")
    p.add_argument("--cp", default="1", help="comma-separated cp sizes for ringtrain (HF runs on one GPU)")
    p.add_argument("--checkpoint", default="none", help="ringtrain activation checkpointing: none or all")
    p.add_argument("--backends", default="", help="ringtrain's model attention allow-list (e.g. cudnn)")
    p.add_argument("--hf-attn", default="default", help="HF SDPA backend: default, flash or cudnn")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    add_shape_args(p)
    p.add_argument("--json", default=None, help="write all rows here")
    return p.parse_args()


def matmul_weights(a):
    qd, kvd = a.heads * a.head_dim, a.kv_heads * a.head_dim
    per_layer = a.hidden * (qd + 2 * kvd) + qd * a.hidden + 3 * a.hidden * a.ffn
    return a.layers * per_layer + a.vocab * a.hidden


def step_flops(a, seq):
    return 6 * matmul_weights(a) * seq + 6 * a.layers * seq * seq * (a.heads * a.head_dim)


def add_shape_args(p):
    """The model shape options of every comparison (default: the Llama-3.2-1B shape)."""
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--ffn", type=int, default=8192)
    p.add_argument("--vocab", type=int, default=128256)


def shape_options(a):
    """The shape as ringtrain's bench commands take it."""
    return ["--arch", "llama", "--layers", str(a.layers), "--hidden", str(a.hidden), "--heads", str(a.heads),
            "--kv-heads", str(a.kv_heads), "--head-dim", str(a.head_dim), "--ffn", str(a.ffn), "--vocab", str(a.vocab)]


def describe(a):
    return "model: llama L=%d hidden=%d heads=%d/%d head_dim=%d ffn=%d vocab=%d tied; N=%.4g matmul weights" % (
        a.layers, a.hidden, a.heads, a.kv_heads, a.head_dim, a.ffn, a.vocab, matmul_weights(a))


def hf_llama(a, max_positions, dtype):
    """transformers' LlamaForCausalLM of the benchmark shape (random init, SDPA attention, tied) on the GPU."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.ffn, num_hidden_layers=a.layers,
                      num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, head_dim=a.head_dim,
                      max_position_embeddings=max_positions, rope_theta=500000.0, tie_word_embeddings=True)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).to(device="cuda", dtype=dtype)
    model.gradient_checkpointing_disable()
    return model


def cuda_median_ms(fn, warmup, iters):
    """fn's median time in ms between CUDA events, after `warmup` calls."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return sorted(times)[len(times) // 2]


def time_hf(a, seqs):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model = hf_llama(a, max(seqs) * 2, torch.bfloat16)
    backend = {"default": None, "flash": [SDPBackend.FLASH_ATTENTION], "cudnn": [SDPBackend.CUDNN_ATTENTION]}[a.hf_attn]
    rows = []
    for seq in seqs:
        row = {"seq": seq, "side": "hf", "attn": a.hf_attn}
        ids = torch.randint(0, a.vocab, (1, seq), device="cuda")

        def step():
            with (sdpa_kernel(backend) if backend else torch.enable_grad()):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            model.zero_grad(set_to_none=True)

        try:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            ms = cuda_median_ms(step, a.warmup, a.iters)
            row.update(status="ok", step_ms=ms, tokens_per_s=seq / (ms * 1e-3),
                       tflops_per_gpu=step_flops(a, seq) / (ms * 1e9), mfu=step_flops(a, seq) / (ms * 1e-3) / PEAK,
                       peak_gib=torch.cuda.max_memory_allocated() / 2**30)
        except torch.cuda.OutOfMemoryError:
            row.update(status="OOM")
            model.zero_grad(set_to_none=True)
        except RuntimeError as ex:
            row.update(status="failed: " + str(ex).split("\n")[0][:200])
            model.zero_grad(set_to_none=True)
        print("HF %s" % json.dumps(row), flush=True)
        rows.append(row)
    del model
    torch.cuda.empty_cache()
    return rows


def run_bench(cmd, tag):
    """Runs a ringtrain benchmark command, echoing its output; returns the JSON rows it printed after `tag` and
    its exit code."""
    print("$ " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sys.stdout.write(proc.stdout)
    prefix = tag + " "
    rows = [json.loads(line[len(prefix):]) for line in proc.stdout.splitlines() if line.startswith(prefix)]
    return rows, proc.returncode


def run_ours(a, seqs, cp):
    cmd = [a.bin, "bench", "model"] + shape_options(a) + ["--seq", ",".join(map(str, seqs)), "--cp", str(cp),
                                                          "--checkpoint", a.checkpoint, "--iters", str(a.iters),
                                                          "--warmup", str(a.warmup)]
    if a.backends:
        cmd += ["--backends", a.backends]
    rows, returncode = run_bench(cmd, "BENCH_MODEL")
    done = {r["seq"] for r in rows}
    for seq in seqs:  # a run that died (e.g. out of memory under CP) printed no row for its shape
        if seq not in done:
            rows.append({"seq": seq, "cp": cp, "status": "no result (exit code %d)" % returncode})
    for r in rows:
        r["side"] = "ringtrain"
    return rows


def main():
    a = parse_args()
    seqs = [int(s) for s in a.seq.split(",")]
    hf_seqs = [int(s) for s in a.hf_seq.split(",")] if a.hf_seq else seqs
    cps = [int(c) for c in a.cp.split(",")]
    print(describe(a) + ", bf16", flush=True)
    hf = {r["seq"]: r for r in time_hf(a, hf_seqs)}
    ours = [r for cp in cps for r in run_ours(a, seqs, cp)]

    print("\n%8s %4s %14s %8s %10s | %14s %8s %10s | %s" % ("S", "cp", "ours tok/s", "MFU", "peak GiB",
                                                            "HF tok/s", "MFU", "peak GiB", "ours/HF per GPU"))
    for r in sorted(ours, key=lambda r: (r["seq"], r["cp"])):
        h = hf.get(r["seq"], {"status": "not run"})
        if r["status"] == "ok":
            left = "%14.0f %7.1f%% %10.1f" % (r["tokens_per_s"], 100 * r["mfu"], r["peak_pool_gib"])
        else:
            left = "%34s" % r["status"][:34]
        right = ("%14.0f %7.1f%% %10.1f" % (h["tokens_per_s"], 100 * h["mfu"], h["peak_gib"]) if h["status"] == "ok"
                 else "%34s" % h["status"][:34])
        ratio = ("%.2fx" % (r["tokens_per_s"] / r["cp"] / h["tokens_per_s"])
                 if r["status"] == "ok" and h["status"] == "ok" else "-")
        print("%8d %4d %s | %s | %s" % (r["seq"], r["cp"], left, right, ratio))
    # The throughput bars, for the rows this run has.
    by_shape = {(r["seq"], r["cp"]): r for r in ours}
    r8, h8, r32, r128 = by_shape.get((8192, 1)), hf.get(8192), by_shape.get((32768, 1)), by_shape.get((131072, 2))
    if r8 and h8 and r8["status"] == "ok" and h8["status"] == "ok":
        ratio = r8["tokens_per_s"] / h8["tokens_per_s"]
        print("bar: 8K throughput >= 1.3x HF: %.2fx %s" % (ratio, "PASS" if ratio >= 1.3 else "FAIL"))
    if r32 and r32["status"] == "ok":
        print("bar: 32K MFU >= 40%% on one GPU: %.1f%% %s" % (100 * r32["mfu"], "PASS" if r32["mfu"] >= 0.40 else "FAIL"))
    if r128:
        print("bar: 128K trains with cp=2: %s" % ("PASS" if r128["status"] == "ok" else "FAIL (%s)" % r128["status"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"hf": list(hf.values()), "ringtrain": ours}, f, indent=1)


if __name__ == "__main__":
    main()
