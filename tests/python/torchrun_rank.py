"""One rank of test_gpu.TestTorchrun: started by torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT set), it
makes its worker of a dp = 2 job on its own GPU, trains one step on a batch of CUDA tensors and one on the same batch
as NumPy arrays (two workers of the same seed), scores the batch, and writes what it got as JSON to argv[1].RANK."""
import json
import os
import sys

import numpy as np
import torch

import ringtrain
from common import SEED, base_config, padded_ids, random_rows


def main():
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    cfg = base_config(SEED, precision="bfloat16")
    cfg["device"] = "cuda"
    cfg["parallel"] = {"dp": 2}
    rng = np.random.default_rng(SEED + 21)  # the same batch on both ranks
    ids, lengths = padded_ids(random_rows(rng, 4), rng=rng)
    batch = {"input_ids": ids, "input_lengths": lengths}
    out = {"rank": rank}
    for name in ("numpy", "cuda"):
        worker = ringtrain.PolicyWorker(cfg)
        out["world_size"] = worker.world_size
        given = batch if name == "numpy" else {k: torch.from_numpy(np.asarray(v)).cuda() for k, v in batch.items()}
        r = worker.train(given)
        out[name] = {"loss": r["loss"], "grad_norm": r["grad_norm"], "valid_tokens": r["valid_tokens"]}
        lp = worker.get_logprobs(given)["logprobs"]
        out[name]["logprobs"] = (lp.cpu().numpy() if name == "cuda" else lp).tolist()
        del worker
    with open(f"{sys.argv[1]}.{rank}", "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
