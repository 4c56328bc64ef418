"""A GRPO-style RL loop in Python over the ringtrain policy worker, with rollouts read from a JSONL file or drawn by
the worker's built-in sampler.

Each step takes policy.train_global_batch_size rollouts (prompt + response tokens, the response's token_mask, the
group-normalised advantage and the sampler's generation_logprobs: what a sampler such as vLLM hands back), scores
them under the current and the reference policy, trains one step with the config's clipped policy-gradient loss,
and prints the metrics (configs/data/grpo.jsonl is synthetic: random tokens and advantages; its generation_logprobs
are the starting policy's of configs/grpo.yaml at its train.seed with N(0, 0.02) noise, the mismatch of a sampler
that computes in another precision). At the end it saves a checkpoint, exports the weights as a Hugging Face folder
and lists what an inference engine would be refit with.

With --rollouts sampler the loop is a whole RL loop: each step draws a group of responses per random prompt with
worker.generate (the current weights; its logprobs are the generation_logprobs), scores each response with a toy
verifiable reward (the fraction of even token ids), normalises the rewards within each group into advantages, and
trains on the group.

    PYTHONPATH=build/python /usr/bin/python3 examples/python/grpo_loop.py --steps 4
    PYTHONPATH=build/python /usr/bin/python3 examples/python/grpo_loop.py --rollouts sampler --steps 8
"""

import argparse
import json
import os
import time

import numpy as np

import ringtrain


def read_rollouts(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def to_batch(rows):
    """Rollout rows as padded [B, S] arrays (entries past a row's length are ignored by the worker)."""
    lengths = np.array([len(r["input_ids"]) for r in rows], np.int64)
    B, S = len(rows), int(lengths.max())
    batch = {"input_ids": np.zeros((B, S), np.int64), "input_lengths": lengths,
             "token_mask": np.zeros((B, S), np.float32), "generation_logprobs": np.zeros((B, S), np.float32),
             "advantages": np.array([r["advantages"] for r in rows], np.float32)}  # one per rollout: [B]
    for b, r in enumerate(rows):
        n = lengths[b]
        batch["input_ids"][b, :n] = r["input_ids"]
        batch["token_mask"][b, :n] = r["token_mask"]
        batch["generation_logprobs"][b, :n] = r["generation_logprobs"]
    return batch


def sampler_rollouts(worker, rng, prompts, group, max_new_tokens, seed):
    """`prompts` random prompts, `group` responses each from worker.generate, as rollout rows with group-normalised
    advantages of the toy reward; also returns the mean reward."""
    vocab = worker.model_config["vocab_size"]
    starts = [rng.integers(0, vocab, size=int(rng.integers(4, 12))).tolist() for _ in range(prompts)]
    gens = worker.generate([p for p in starts for _ in range(group)], max_new_tokens, temperature=1.0, seed=seed)
    rewards = np.array([np.mean(g["tokens"] % 2 == 0) for g in gens], np.float64).reshape(prompts, group)
    # The sample std (ddof=1), as NeMo RL and `ringtrain grpo` divide by.
    advantages = (rewards - rewards.mean(axis=1, keepdims=True)) / (rewards.std(axis=1, ddof=1, keepdims=True) + 1e-6)
    rows = []
    for i, g in enumerate(gens):
        p, n = starts[i // group], len(g["tokens"])
        rows.append({"input_ids": p + g["tokens"].tolist(), "token_mask": [0] * len(p) + [1] * n,
                     "generation_logprobs": [0.0] * len(p) + g["logprobs"].tolist(),
                     "advantages": float(advantages.flat[i])})
    return rows, float(rewards.mean())


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=os.path.join(root, "configs", "grpo.yaml"))
    ap.add_argument("--data", default=os.path.join(root, "configs", "data", "grpo.jsonl"))
    ap.add_argument("--rollouts", choices=["file", "sampler"], default="file",
                    help="rollouts from --data, or drawn each step by the built-in sampler")
    ap.add_argument("--group", type=int, default=4, help="sampler: responses per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=24, help="sampler: tokens per response at most")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--out", default=os.path.join(root, "runs", "python_grpo"))
    ap.add_argument("overrides", nargs="*", help="KEY=VALUE config overrides, e.g. train.seed=3")
    args = ap.parse_args()

    worker = ringtrain.PolicyWorker(args.config, args.overrides)
    print(worker)
    rollouts = read_rollouts(args.data)
    gbs = int(ringtrain.load_config(args.config, args.overrides).split("train_global_batch_size: ")[1].split()[0])
    schedule = ringtrain.BatchSchedule(len(rollouts), gbs, seed=0)

    if args.rollouts == "sampler" and args.group < 2:
        ap.error(f"--group {args.group}: a group needs 2 or more responses")
    if args.rollouts == "sampler" and gbs % args.group:
        ap.error(f"policy.train_global_batch_size {gbs} is not a multiple of --group {args.group}")
    rng = np.random.default_rng(0)
    for step in range(args.steps):
        t0 = time.perf_counter()
        reward = None
        if args.rollouts == "sampler":
            rows, reward = sampler_rollouts(worker, rng, gbs // args.group, args.group, args.max_new_tokens, step)
            batch = to_batch(rows)
        else:
            batch = to_batch([rollouts[u] for u in schedule.step_units(step)])
        # The policy's logprobs before the update (the ratio's denominator) and the reference policy's (the KL
        # term). train() would compute both itself when they are missing; a loop that wants them logged passes them.
        batch["prev_logprobs"] = worker.get_logprobs(batch)["logprobs"]
        batch["reference_logprobs"] = worker.get_reference_logprobs(batch)["reference_logprobs"]
        mask = batch["token_mask"].astype(bool)
        mismatch = np.abs(batch["prev_logprobs"] - batch["generation_logprobs"])[mask].mean()
        m = worker.train(batch)
        print(f"step {m['step']}: loss {m['loss']:+.4f}  grad_norm {m['grad_norm']:.3f}  lr {m['lr']:.2e}  "
              f"ref_kl {m['metrics'].get('ref_kl', 0):.2e}  |prev - gen| {mismatch:.3f}  "
              + (f"reward {reward:.3f}  " if reward is not None else "") +
              f"{m['tokens_per_second']:.0f} tok/s  ({time.perf_counter() - t0:.2f} s with scoring)")

    os.makedirs(args.out, exist_ok=True)
    worker.save(os.path.join(args.out, f"step_{worker.steps_taken}"), index=args.steps * gbs)
    worker.export_hf(os.path.join(args.out, "hf"))
    info = worker.refit_info()
    params = sum(int(np.prod(e["shape"])) for e in info)
    print(f"saved {args.out}/step_{worker.steps_taken}, exported {args.out}/hf: {len(info)} tensors, "
          f"{params} parameters ({info[0]['name']} {info[0]['shape']} {info[0]['dtype']}, ...)")


if __name__ == "__main__":
    main()
