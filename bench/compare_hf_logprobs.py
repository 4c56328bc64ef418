#!/usr/bin/env python3
"""Scoring throughput: ringtrain's policy worker `get_logprobs` against Hugging Face transformers' forward +
log-softmax, same shape, same job, one GPU.

The Hugging Face side: LlamaForCausalLM from a LlamaConfig of the benchmark shape (random init, bf16, SDPA
attention), under torch.no_grad: logits = model(ids).logits, then log_softmax in fp32 and the gather of the next
tokens (what an RL loop computes for prev/reference logprobs); warm-up calls, then the median between CUDA events.
Then the model is freed and `ringtrain bench rollouts` scores one sequence of the same length through the worker
(`--sequences 1 --min-len S --max-len S --no-train`): its "packed" logprobs row is the wall time of a whole
get_logprobs call, host results included (ringtrain's side is timed the conservative way).

  python3 bench/compare_hf_logprobs.py --bin build/ringtrain --seq 8192

With --power, nvidia-smi samples the GPU's power draw, SM clock and clock-event reasons every 20 ms while each side
runs; each side reports the means over its samples that draw at least --active-watts (its calls, not its set-up:
an 8K call draws 650-880 W, the idle GPU about 100 W) and the share of them with the software power cap active.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime

from compare_hf_model import add_shape_args, cuda_median_ms, describe, hf_llama, shape_options


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", required=True, help="the ringtrain executable")
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    add_shape_args(p)
    p.add_argument("--json", default=None, help="write both rows and the ratio here")
    p.add_argument("--power", action="store_true", help="sample power and SM clock during each side's calls")
    p.add_argument("--active-watts", type=float, default=300.0, help="--power: samples below this are idle")
    a = p.parse_args()
    if a.active_watts < 0:
        p.error("--active-watts must be >= 0 (got %g)" % a.active_watts)
    return a


SW_POWER_CAP = 0x4  # nvidia-smi clocks_event_reasons.active: clocks reduced by the software power cap


class PowerSampler:
    """nvidia-smi's power, SM clock and clock-event reasons of GPU 0 every 20 ms, read by a thread."""

    def __init__(self):
        query = "timestamp,power.draw,clocks.sm,clocks_event_reasons.active"
        try:
            self.proc = subprocess.Popen(["nvidia-smi", "-i", "0", "--query-gpu=" + query,
                                          "--format=csv,noheader,nounits", "-lms", "20"],
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except FileNotFoundError:
            sys.exit("--power needs nvidia-smi on PATH")
        self.samples = []  # (unix time, watts, MHz, reasons)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            fields = [f.strip() for f in line.split(",")]
            try:
                t = datetime.strptime(fields[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                self.samples.append((t, float(fields[1]), float(fields[2]), int(fields[3], 16)))
            except (ValueError, IndexError):
                continue  # a field nvidia-smi reports as [N/A] or a partial line

    def summary(self, t0, t1, active_watts):
        got = [s for s in self.samples if t0 <= s[0] <= t1 and s[1] >= active_watts]
        if not got:
            return {"power_samples": 0}
        return {"power_samples": len(got), "mean_watts": sum(s[1] for s in got) / len(got),
                "max_watts": max(s[1] for s in got), "mean_sm_mhz": sum(s[2] for s in got) / len(got),
                "power_capped_share": sum(1 for s in got if s[3] & SW_POWER_CAP) / len(got)}

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def time_hf(a):
    import torch

    model = hf_llama(a, a.seq * 2, torch.bfloat16).eval()
    ids = torch.randint(0, a.vocab, (1, a.seq), device="cuda")
    scores = []

    @torch.no_grad()
    def score():
        logits = model(input_ids=ids).logits[:, :-1].float()
        scores.append(torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1))

    ms = cuda_median_ms(score, a.warmup, a.iters)
    assert torch.isfinite(scores[-1]).all()
    row = {"side": "hf", "seq": a.seq, "seconds": ms / 1e3, "peak_gib": torch.cuda.max_memory_allocated() / 2**30}
    del model, scores
    torch.cuda.empty_cache()
    return row


def run_ours(a):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rollouts.json")
        cmd = [a.bin, "bench", "rollouts", "--device", "cuda", "--sequences", "1", "--min-len", str(a.seq),
               "--max-len", str(a.seq), "--mb-tokens", str(a.seq), "--padded-batch", "1", "--no-train",
               "--iters", str(a.iters), "--warmup", str(a.warmup), "--json", out] + shape_options(a)
        print("$ " + " ".join(cmd), flush=True)
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        sys.stdout.write(proc.stdout)
        if proc.returncode != 0:
            return {"side": "ringtrain", "seq": a.seq, "status": "exit code %d" % proc.returncode}
        with open(out) as f:
            report = json.load(f)
    row = next(r for r in report["rows"] if r["layout"] == "packed" and r["pass"] == "logprobs")
    return {"side": "ringtrain", "seq": a.seq, "seconds": row["seconds"], "tokens": row["tokens"]}


def main():
    a = parse_args()
    print(describe(a) + ", bf16", flush=True)
    sampler = PowerSampler() if a.power else None

    def timed_side(run):
        t0 = time.time()
        row = run(a)
        if sampler:
            time.sleep(0.1)  # the last samples of the side
            row.update(sampler.summary(t0, time.time(), a.active_watts))
        return row

    try:
        hf = timed_side(time_hf)
        ours = timed_side(run_ours)
    finally:
        if sampler:
            sampler.stop()  # no nvidia-smi left running when a side fails
    print("HF %s" % json.dumps(hf))
    print("ringtrain %s" % json.dumps(ours))
    result = {"hf": hf, "ringtrain": ours}
    if "seconds" in ours:
        ratio = hf["seconds"] / ours["seconds"]
        result["ours_over_hf"] = ratio
        print("S=%d: HF forward+log_softmax %.1f ms, ringtrain get_logprobs %.1f ms: %.2fx (bar 1.5x: %s)" % (
            a.seq, 1e3 * hf["seconds"], 1e3 * ours["seconds"], ratio, "PASS" if ratio >= 1.5 else "FAIL"))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
