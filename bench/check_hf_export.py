#!/usr/bin/env python3
"""A checkpoint trained on the GPU, exported, loaded by Hugging Face transformers: its logprobs against ringtrain's.

1. `ringtrain train` a few SFT steps on one GPU in bf16 (configs/sft.yaml on a builtin shape, checkpoint at the end);
2. `ringtrain export` that checkpoint to a Hugging Face folder;
3. `ringtrain logprobs --config ... --checkpoint` scores the data file from the training checkpoint (GPU, bf16);
4. transformers loads the exported folder (`AutoModelForCausalLM`, fp32 on the GPU) and scores the same lines
   (log_softmax of the logits, gathered at the next tokens).
Tolerance, as the GPU policy test's against an fp64 reference: per token 2e-2 + |logprob| / 128 (bf16 compute against
fp32), mean absolute error at most 2e-2; a wrong weight name, layout or transposition is an O(1) error.

  python3 bench/check_hf_export.py --bin build/ringtrain [--model builtin:small] [--steps 4]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def run(cmd):
    print("$ " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sys.stdout.write(proc.stdout[-3000:])
    if proc.returncode != 0:
        sys.exit("failed (exit code %d): %s" % (proc.returncode, " ".join(cmd)))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", required=True)
    p.add_argument("--config", default="configs/sft.yaml")
    p.add_argument("--data", default="configs/data/sft.jsonl")
    p.add_argument("--model", default="builtin:small")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--json", default=None)
    a = p.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as tmp:
        ckpt, hf, ours = os.path.join(tmp, "ckpt"), os.path.join(tmp, "hf"), os.path.join(tmp, "ours.jsonl")
        overrides = ["device=cuda", "policy.precision=bfloat16", "policy.model_name=" + a.model,
                     "train.steps=%d" % a.steps, "train.checkpoint_dir=" + ckpt, "train.checkpoint_every=%d" % a.steps,
                     "train.metrics_dir=" + os.path.join(tmp, "metrics")]
        run([a.bin, "train", "--config", a.config] + overrides)
        step = os.path.join(ckpt, "step_%d" % a.steps)
        run([a.bin, "export", step, "--out", hf])
        run([a.bin, "logprobs", "--config", a.config] + overrides +
            ["--checkpoint", step, "--data", a.data, "--out", ours])
        with open(ours) as f:
            ours_lp = [json.loads(line)["logprobs"] for line in f]
        with open(a.data) as f:
            rows = [json.loads(line)["input_ids"] for line in f if line.strip()]
        model = AutoModelForCausalLM.from_pretrained(hf, torch_dtype=torch.float32).to("cuda").eval()

    assert len(rows) == len(ours_lp), (len(rows), len(ours_lp))
    worst, worst_excess, total, count = 0.0, -1.0, 0.0, 0
    with torch.no_grad():
        for ids, lp in zip(rows, ours_lp):
            t = torch.tensor([ids], device="cuda")
            logits = model(input_ids=t).logits[0, :-1].float()
            ref = torch.log_softmax(logits, -1).gather(-1, t[0, 1:, None]).squeeze(-1).double().cpu()
            got = torch.tensor(lp[1:], dtype=torch.float64)
            assert lp[0] == 0.0 and len(lp) == len(ids)
            err = (got - ref).abs()
            assert torch.isfinite(err).all()
            worst = max(worst, err.max().item())
            worst_excess = max(worst_excess, (err - (2e-2 + ref.abs() / 128)).max().item())
            total += err.sum().item()
            count += err.numel()
    mean = total / count
    ok = worst_excess <= 0 and mean <= 2e-2
    print("transformers (fp32) vs ringtrain (GPU bf16) on %d lines, %d tokens: max |diff| %.4g, mean %.4g: %s" % (
        len(rows), count, worst, mean, "PASS" if ok else "FAIL"))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"lines": len(rows), "tokens": count, "max_abs_diff": worst, "mean_abs_diff": mean,
                       "pass": ok, "model": a.model, "steps": a.steps}, f, indent=1)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
