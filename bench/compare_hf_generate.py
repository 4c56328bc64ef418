#!/usr/bin/env python3
"""Batched generation throughput of ringtrain's GPU sampler against Hugging Face transformers, same shape, same job.

The Hugging Face side (one GPU): LlamaForCausalLM from a LlamaConfig of the benchmark shape (random init, bf16, SDPA
attention), `generate` with cache_implementation="static", do_sample=True, temperature 1, top_k=0 and top_p=1 (no
truncation: transformers would otherwise default to top_k=50), min_new_tokens = max_new_tokens (no early stop), on a
batch of random prompts of one length. --hf-compile auto leaves transformers' default (a static cache makes it
compile the decoding step when it can); off sets disable_compile. Timed between CUDA events after a first untimed
call (and --hf-warmup more), the median call: a logits processor records an event at each draw, so one call gives
the prefill (up to the first draw) and the decoding (first draw to last); decode tokens/s = batch * (N - 1) /
decoding time.

The ringtrain side: `ringtrain bench generate` on the same shape (its BENCH_GENERATE line is parsed): the prefill and
the decoding are split by CUDA events inside one generate(); decode tokens/s = batch * (N - 1) / decode time.

  python3 bench/compare_hf_generate.py --bin build/ringtrain [--batch 64 --prompt 512 --new-tokens 512]
"""
import argparse
import json

from compare_hf_model import add_shape_args, describe, hf_llama, run_bench, shape_options


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", required=True, help="the ringtrain executable")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=512)
    p.add_argument("--iters", type=int, default=3, help="timed calls (median)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--hf-iters", type=int, default=2, help="timed HF calls (median)")
    p.add_argument("--hf-warmup", type=int, default=0, help="HF calls before the timed ones (after the first call)")
    p.add_argument("--hf-compile", default="auto", help="comma-separated HF runs: auto (transformers' default), off")
    p.add_argument("--skip-hf", action="store_true")
    add_shape_args(p)
    p.add_argument("--json", default=None, help="write both results here")
    return p.parse_args()


def time_hf(a, compile_mode):
    import time

    import torch
    from transformers import LogitsProcessor, LogitsProcessorList

    class StepEvents(LogitsProcessor):
        """Records a CUDA event each time generate() asks for the next token's logits (no synchronisation)."""

        def __init__(self):
            self.events = []

        def __call__(self, input_ids, scores):
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.events.append(e)
            return scores

    model = hf_llama(a, a.prompt + a.new_tokens + 16, torch.bfloat16)
    model.eval()
    ids = torch.randint(0, a.vocab, (a.batch, a.prompt), device="cuda")
    mask = torch.ones_like(ids)

    def gen():
        """One generate(): total ms, prefill ms (up to the first draw), ms from the first draw to the last, draws."""
        kw = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=a.new_tokens,
                  min_new_tokens=a.new_tokens, cache_implementation="static", pad_token_id=0)
        if compile_mode == "off":
            kw["disable_compile"] = True
        steps = StepEvents()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, logits_processor=LogitsProcessorList([steps]), **kw)
        stop.record()
        stop.synchronize()
        assert out.shape == (a.batch, a.prompt + a.new_tokens), out.shape
        return (start.elapsed_time(stop), start.elapsed_time(steps.events[0]),
                steps.events[0].elapsed_time(steps.events[-1]), len(steps.events))

    row = {"side": "hf", "compile": compile_mode, "batch": a.batch, "prompt": a.prompt, "new_tokens": a.new_tokens}
    try:
        t0 = time.time()
        gen()  # the first call: compilation when there is one
        row["first_call_s"] = time.time() - t0
        for _ in range(a.hf_warmup):
            gen()
        runs = sorted((gen() for _ in range(a.hf_iters)), key=lambda r: r[0])
        total, prefill, decode, draws = runs[len(runs) // 2]
        row.update(status="ok", total_ms=total, prefill_ms=prefill, decode_ms=decode, draws=draws,
                   decode_tokens_per_s=a.batch * (draws - 1) / (decode * 1e-3),
                   generate_tokens_per_s=a.batch * a.new_tokens / (total * 1e-3))
    except torch.cuda.OutOfMemoryError:
        row.update(status="OOM")
    except Exception as ex:  # noqa: BLE001 (any failure of the HF side is reported, not fatal)
        row.update(status="failed: " + str(ex).split("\n")[0][:300])
    print("HF %s" % json.dumps(row), flush=True)
    del model
    torch.cuda.empty_cache()
    return row


def run_ours(a):
    cmd = [a.bin, "bench", "generate"] + shape_options(a) + [
        "--batch", str(a.batch), "--prompt", str(a.prompt), "--new-tokens", str(a.new_tokens),
        "--iters", str(a.iters), "--warmup", str(a.warmup)]
    rows, returncode = run_bench(cmd, "BENCH_GENERATE")
    if not rows:
        return {"side": "ringtrain", "status": "no result (exit code %d)" % returncode}
    rows[0].update(side="ringtrain", status="ok")
    return rows[0]


def main():
    a = parse_args()
    print(describe(a) + ", bf16; batch %d x prompt %d + %d new tokens" % (a.batch, a.prompt, a.new_tokens),
          flush=True)
    ours = run_ours(a)
    hf = [] if a.skip_hf else [time_hf(a, mode) for mode in a.hf_compile.split(",")]
    print("\n%-16s %12s %12s %16s %16s" % ("", "prefill ms", "decode ms", "decode tok/s", "generate tok/s"))
    if ours["status"] == "ok":
        print("%-16s %12.1f %12.1f %16.0f %16.0f" % ("ringtrain", ours["prefill_ms"], ours["decode_ms"],
                                                    ours["decode_tokens_per_s"], ours["generate_tokens_per_s"]))
    else:
        print("%-16s %s" % ("ringtrain", ours["status"]))
    for h in hf:
        name = "HF compile " + h["compile"]
        if h["status"] != "ok":
            print("%-16s %s" % (name, h["status"]))
            continue
        print("%-16s %12.1f %12.1f %16.0f %16.0f   (first call %.1f s)" % (
            name, h["prefill_ms"], h["decode_ms"], h["decode_tokens_per_s"], h["generate_tokens_per_s"],
            h["first_call_s"]))
        if ours["status"] == "ok":
            ratio = ours["decode_tokens_per_s"] / h["decode_tokens_per_s"]
            print("  ratio decode tokens/s ringtrain / %s = %.2fx (bar >= 2x: %s); generate tokens/s %.2fx" % (
                name, ratio, "PASS" if ratio >= 2 else "FAIL",
                ours["generate_tokens_per_s"] / h["generate_tokens_per_s"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"hf": hf, "ringtrain": ours}, f, indent=1)


if __name__ == "__main__":
    main()
