#!/usr/bin/env python3
"""Golden fixtures for ringtrain's model tests, made with Hugging Face transformers (CPU is enough).

For each architecture a tiny random checkpoint is written with save_pretrained (so config.json is in the
format the installed transformers writes), reloaded in fp32 with SDPA attention, and scored on fixed
token ids: next-token log-probabilities (position 0 = 0) and the gradient of
loss = sum over sequences and positions of the log-probabilities w.r.t. a few named weights.
A checkpoint written by `ringtrain init-model` (tests/fixtures/model/ringtrain_written/checkpoint, if present)
is loaded the same way, which checks that transformers accepts ringtrain's files.

Usage: python3 scripts/make_model_fixtures.py --out DIR   (writes DIR/<name>/{checkpoint/, expected.json})
"""
import argparse
import json
import os
import shutil
import sys
import traceback

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, hidden_act="silu",
            attention_dropout=0.0)

# name -> (config.json additions, storage dtype, shard size or None, gradient names beyond the common ones)
CASES = {
    "llama": (dict(architectures=["LlamaForCausalLM"], model_type="llama", rope_theta=500000.0,
                   tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                   rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                     original_max_position_embeddings=16)),
              torch.float32, None, []),
    "qwen2": (dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", rope_theta=1000000.0,
                   tie_word_embeddings=False, use_sliding_window=False, sliding_window=None),
              torch.bfloat16, None, ["model.layers.0.self_attn.q_proj.bias", "model.layers.1.self_attn.v_proj.bias"]),
    "qwen3": (dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", rope_theta=1000000.0, head_dim=32,
                   tie_word_embeddings=True, attention_bias=False, use_sliding_window=False, sliding_window=None),
              torch.bfloat16, None, ["model.layers.1.self_attn.q_norm.weight", "model.layers.0.self_attn.k_norm.weight"]),
    "mistral": (dict(architectures=["MistralForCausalLM"], model_type="mistral", rope_theta=10000.0,
                     tie_word_embeddings=False, sliding_window=4096),
                torch.float16, "100KB", []),
}
COMMON_GRADS = ["model.norm.weight", "model.layers.0.input_layernorm.weight",
                "model.layers.1.post_attention_layernorm.weight", "model.layers.1.self_attn.k_proj.weight"]
SEQ_LENS = [24, 13]


def load(path, dtype):
    try:
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
    except TypeError:
        return AutoModelForCausalLM.from_pretrained(path, torch_dtype=dtype, attn_implementation="sdpa")


def score(model, sequences, grad_names):
    """Log-probabilities per sequence (position 0 = 0) and d(sum of all)/d(named weights)."""
    model.zero_grad(set_to_none=True)
    params = dict(model.named_parameters())
    out = []
    for ids in sequences:
        x = torch.tensor([ids])
        logits = model(input_ids=x).logits.float()
        lp = torch.log_softmax(logits[0, :-1], dim=-1).gather(-1, x[0, 1:, None])[:, 0]
        lp.sum().backward()
        out.append([0.0] + lp.detach().double().tolist())
    grads = {}
    for n in grad_names:
        if n in params:
            grads[n] = params[n].grad.detach().double().flatten().tolist()
        elif n == "lm_head.weight" and model.config.tie_word_embeddings:
            grads[n] = params["model.embed_tokens.weight"].grad.detach().double().flatten().tolist()
        else:
            raise KeyError("no parameter %s in %s" % (n, sorted(params)))
    return out, grads


def inv_freq_of(model):
    emb = getattr(model.model, "rotary_emb", None)
    return emb.inv_freq.detach().double().tolist() if emb is not None else None


def expected_for(ckpt, sequences, grad_names):
    # fp32 only: transformers' RMSNorm computes in fp32 whatever the model dtype, so an fp64 run would not be
    # a more exact reference.
    m32 = load(ckpt, torch.float32)
    lp32, g32 = score(m32, sequences, grad_names)
    return {"sequences": sequences, "loss": "sum of logprobs over all sequences and positions",
            "logprobs_fp32": lp32, "grads_fp32": g32, "rope_inv_freq": inv_freq_of(m32),
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__}}


def make_case(name, extra, dtype, shard, more_grads, out_dir, gen):
    case_dir = os.path.join(out_dir, name)
    ckpt = os.path.join(case_dir, "checkpoint")
    os.makedirs(ckpt, exist_ok=True)
    cfg_dict = dict(TINY, **extra)
    with open(os.path.join(ckpt, "config.json"), "w") as f:  # legacy keys; transformers converts them
        json.dump(cfg_dict, f)
    cfg = AutoConfig.from_pretrained(ckpt)
    torch.manual_seed(1000 + len(name))
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    with torch.no_grad():  # non-trivial norms and biases so that their gradients and effects are tested
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif n.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))
    model = model.to(dtype)
    kwargs = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(ckpt, **kwargs)
    for extra_file in ("generation_config.json",):
        if os.path.exists(os.path.join(ckpt, extra_file)):
            os.remove(os.path.join(ckpt, extra_file))
    sequences = [torch.randint(0, TINY["vocab_size"], (s,), generator=gen).tolist() for s in SEQ_LENS]
    exp = expected_for(ckpt, sequences, COMMON_GRADS + more_grads)
    exp.update({"arch": name, "storage_dtype": str(dtype).replace("torch.", "")})
    with open(os.path.join(case_dir, "expected.json"), "w") as f:
        json.dump(exp, f)
    print("%s: %s, files %s" % (name, exp["storage_dtype"], sorted(os.listdir(ckpt))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--ringtrain-written", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures",
                                                                "model", "ringtrain_written", "checkpoint"))
    a = ap.parse_args()
    torch.set_num_threads(4)
    gen = torch.Generator().manual_seed(20261130)
    failures = 0
    for name, (extra, dtype, shard, more) in CASES.items():
        try:
            make_case(name, extra, dtype, shard, more, a.out, gen)
        except Exception:
            failures += 1
            print("%s FAILED" % name)
            traceback.print_exc()
    if os.path.isdir(a.ringtrain_written):
        case_dir = os.path.join(a.out, "ringtrain_written")
        os.makedirs(case_dir, exist_ok=True)
        try:
            with open(os.path.join(a.ringtrain_written, "config.json")) as f:
                vocab = json.load(f)["vocab_size"]
            sequences = [torch.randint(0, vocab, (s,), generator=gen).tolist() for s in SEQ_LENS]
            exp = expected_for(a.ringtrain_written, sequences, COMMON_GRADS)
            exp["arch"] = "ringtrain_written"
        except Exception:
            failures += 1
            exp = {"arch": "ringtrain_written", "load_error": traceback.format_exc()}
            print("ringtrain_written FAILED")
            traceback.print_exc()
        with open(os.path.join(case_dir, "expected.json"), "w") as f:
            json.dump(exp, f)
    print("done, %d failures" % failures)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
