"""Shared pieces of the ringtrain module's tests: the source tree, the CLI, fresh seeds, configs and batches."""

import json
import os
import random
import subprocess
import sys

import numpy as np

SOURCE_DIR = os.environ.get("RINGTRAIN_SOURCE_DIR",
                            os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
CLI = os.environ.get("RINGTRAIN_CLI", os.path.join(SOURCE_DIR, "build", "ringtrain"))

# A fresh seed per run (weights of the builtin models and the random batches); printed so a failure can be rerun
# with RINGTRAIN_TEST_SEED.
SEED = int(os.environ.get("RINGTRAIN_TEST_SEED", random.SystemRandom().randrange(1, 2**31)))
print(f"ringtrain python tests: RINGTRAIN_TEST_SEED={SEED}", file=sys.stderr)


def yaml_text(d, indent=0):
    """A nested dict of scalars and lists as block YAML (the tests need no YAML package)."""
    def scalar(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, float):
            return repr(v)
        return str(v)

    lines = []
    for k, v in d.items():
        pad = "  " * indent
        if isinstance(v, dict):
            lines.append(f"{pad}{k}:")
            lines.append(yaml_text(v, indent + 1))
        elif isinstance(v, list):
            lines.append(f"{pad}{k}: [{', '.join(scalar(x) for x in v)}]")
        else:
            lines.append(f"{pad}{k}: {scalar(v)}")
    return "\n".join(lines)


def base_config(seed=SEED, **policy):
    """A small NLL run on builtin:tiny (vocab 256) on one CPU rank."""
    p = {"model_name": "builtin:tiny", "train_global_batch_size": 4, "train_micro_batch_size": 2,
         "logprob_batch_size": 3, "max_total_sequence_length": 48, "precision": "float32", "max_grad_norm": 1.0,
         "optimizer": {"kwargs": {"lr": 1.0e-3, "weight_decay": 0.0}}}
    p.update(policy)
    return {"policy": p, "loss_fn": {"type": "nll"}, "device": "cpu", "train": {"seed": seed}}


def write_config(path, config):
    with open(path, "w") as f:
        f.write(yaml_text(config) + "\n")
    return path


def random_rows(rng, n, vocab=256, min_len=2, max_len=40):
    return [rng.integers(0, vocab, size=int(rng.integers(min_len, max_len + 1))).tolist() for _ in range(n)]


def padded_ids(rows, width=None, fill=None, rng=None, dtype=np.int64):
    """[B, S] token ids with the rows' lengths; past a row's length: `fill`, or random tokens when fill is None."""
    width = width or max(len(r) for r in rows)
    rng = rng or np.random.default_rng(0)
    ids = rng.integers(0, 256, size=(len(rows), width)) if fill is None else np.full((len(rows), width), fill)
    for b, r in enumerate(rows):
        ids[b, :len(r)] = r
    return ids.astype(dtype), np.array([len(r) for r in rows], dtype=np.int64)


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def rows_to_batch(rows):
    """JSONL training rows (data.h) as a padded batch dict."""
    lengths = [len(r["input_ids"]) for r in rows]
    B, S = len(rows), max(lengths)
    batch = {"input_ids": np.zeros((B, S), np.int64), "input_lengths": np.array(lengths, np.int64)}
    for b, r in enumerate(rows):
        batch["input_ids"][b, :lengths[b]] = r["input_ids"]
    for key in ("token_mask", "generation_logprobs", "prev_logprobs", "reference_logprobs", "advantages"):
        if key not in rows[0]:
            continue
        if key == "advantages" and not isinstance(rows[0][key], list):
            batch[key] = np.array([r[key] for r in rows], np.float32)
            continue
        a = np.zeros((B, S), np.float32)
        for b, r in enumerate(rows):
            a[b, :lengths[b]] = r[key]
        batch[key] = a
    if "sample_mask" in rows[0]:
        batch["sample_mask"] = np.array([r["sample_mask"] for r in rows], np.float32)
    return batch


def run_cli(*args, cwd=SOURCE_DIR):
    r = subprocess.run([CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise AssertionError(f"ringtrain {' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r.stdout


def cli_logprobs(config_path, rows, tmp, *extra):
    data = os.path.join(tmp, "cli_rows.jsonl")
    with open(data, "w") as f:
        for r in rows:
            f.write(json.dumps({"input_ids": r}) + "\n")
    out = os.path.join(tmp, "cli_logprobs.jsonl")
    run_cli("logprobs", "--config", config_path, "--data", data, "--out", out, *extra)
    return [r["logprobs"] for r in read_jsonl(out)]
