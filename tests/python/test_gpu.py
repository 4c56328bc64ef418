"""The ringtrain module with a GPU worker (device: cuda, bf16) and PyTorch tensors: against the CPU fp32 worker on the
same weights, against itself fed NumPy arrays, and against the CLI's GPU run. Skipped, saying why, without PyTorch,
without a GPU, or with a module built without CUDA (CI's machine has none of them; the GPU machine has all three).

Tolerances: the GPU worker computes in bf16 (weights, activations) with fp32 accumulation and an fp32 LM head, the
CPU worker in fp32. Per token the difference is held to 3e-2 plus 1/64 of the logprob's magnitude (about four bf16
ulps), the mean over tokens to 1e-2: the C++ GPU policy tests' bounds for the same comparison. Results of the same
GPU worker on the same tokens are bitwise equal whatever container carried them (NumPy, CPU or CUDA tensors); two
runs of one training step (CLI and module) agree to 1e-5 relative, the order of the backward's atomic adds aside.
"""

import importlib.util
import json
import math
import os
import sys
import tempfile
import unittest

import numpy as np

import ringtrain
from common import SEED, base_config, padded_ids, random_rows, read_jsonl, rows_to_batch, run_cli, write_config

HAVE_TORCH = importlib.util.find_spec("torch") is not None


def gpu_skip_reason():
    if not HAVE_TORCH:
        return "PyTorch is not installed"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA GPU"
    try:
        ringtrain.PolicyWorker(gpu_config())
    except (ringtrain.Error, ValueError) as e:  # a CPU-only build refuses device: cuda in the config or the worker
        if "cuda" in str(e).lower():
            return f"this build of ringtrain cannot run on the GPU: {e}"
        raise
    return None


def gpu_config(seed=SEED, **policy):
    c = base_config(seed, precision="bfloat16", **policy)
    c["device"] = "cuda"
    return c


SKIP = gpu_skip_reason()


@unittest.skipIf(SKIP is not None, SKIP or "")
class TestGpuWorker(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.rng = np.random.default_rng(SEED + 11)
        cls.gpu = ringtrain.PolicyWorker(gpu_config())
        cls.rows = random_rows(cls.rng, 5)

    def test_gpu_scores_like_the_cpu_worker_on_the_same_weights(self):
        ids, lengths = padded_ids(self.rows, rng=self.rng)
        batch = {"input_ids": ids, "input_lengths": lengths}
        got = np.full(ids.shape, np.nan, np.float32)
        got[...] = self.gpu.get_logprobs(batch)["logprobs"]
        want = ringtrain.PolicyWorker(base_config()).get_logprobs(batch)["logprobs"]
        self.assertEqual(self.gpu.device, "cuda:0")
        diffs = []
        for b, n in enumerate(lengths):
            g, w = got[b, 1:n].astype(np.float64), want[b, 1:n].astype(np.float64)
            self.assertTrue(np.all(np.isfinite(g)), f"row {b}")
            self.assertTrue(np.all(np.abs(g - w) <= 3e-2 + np.abs(w) / 64), f"row {b}: {np.max(np.abs(g - w))}")
            self.assertTrue(np.all(got[b, n:] == 0) and got[b, 0] == 0, f"row {b}: padding or position 0")
            diffs.append(np.abs(g - w))
        mean = float(np.mean(np.concatenate(diffs)))
        self.assertLessEqual(mean, 1e-2)
        # The scores depend on the weights and tokens: far from a constant.
        self.assertGreater(float(np.ptp(np.concatenate([want[b, 1:n] for b, n in enumerate(lengths)]))), 0.1)
        print(f"gpu vs cpu worker: max |logprob difference| {max(map(np.max, diffs)):.4f}, mean {mean:.5f}")

    def test_cuda_tensors_in_cuda_tensors_out(self):
        import torch

        ids, lengths = padded_ids(self.rows, rng=self.rng)
        mask = self.rng.integers(0, 2, ids.shape).astype(bool)
        want = self.gpu.get_logprobs({"input_ids": ids, "input_lengths": lengths, "token_mask": mask},
                                     with_entropy=True)
        for device in ("cpu", "cuda"):
            batch = {"input_ids": torch.from_numpy(ids).to(device), "input_lengths": torch.from_numpy(lengths),
                     "token_mask": torch.from_numpy(mask).to(device)}
            out = self.gpu.get_logprobs(batch, with_entropy=True)
            for key in ("logprobs", "entropy"):
                self.assertIsInstance(out[key], torch.Tensor)
                self.assertEqual((out[key].dtype, out[key].device.type), (torch.float32, device), key)
                np.testing.assert_array_equal(out[key].cpu().numpy(), want[key], err_msg=f"{device} {key}")

    def test_cuda_ids_are_scored_in_place_into_cuda_results(self):
        import torch

        ids, lengths = padded_ids(self.rows, rng=self.rng)
        host = {"input_ids": ids, "input_lengths": lengths}
        want = self.gpu.get_logprobs(host, with_entropy=True)
        want_ref = self.gpu.get_reference_logprobs(host)["reference_logprobs"]
        # Every other column of a wider tensor: a strided view; the columns between and past each length hold ids
        # outside the vocabulary, which must never be read.
        wide = torch.full((ids.shape[0], 2 * ids.shape[1]), 10**6, dtype=torch.int64, device="cuda")
        wide[:, ::2] = torch.from_numpy(ids).cuda()
        for view in (wide[:, ::2], wide[:, ::2].to(torch.int32)):
            batch = {"input_ids": view, "input_lengths": torch.from_numpy(lengths),
                     "token_mask": torch.ones(ids.shape, dtype=torch.bool, device="cuda")}
            out = self.gpu.get_logprobs(batch, with_entropy=True)
            ref = self.gpu.get_reference_logprobs(batch)["reference_logprobs"]
            for key, got, expected in (("logprobs", out["logprobs"], want["logprobs"]),
                                       ("entropy", out["entropy"], want["entropy"]), ("reference", ref, want_ref)):
                self.assertEqual((got.device, got.dtype, tuple(got.shape)), (view.device, torch.float32, ids.shape))
                np.testing.assert_array_equal(got.cpu().numpy(), expected, err_msg=f"{view.dtype} {key}")

    def test_a_bad_cuda_batch_raises_naming_the_key(self):
        import torch

        ids, _ = padded_ids(self.rows, rng=self.rng)
        bad = torch.from_numpy(ids).cuda()
        bad[1, 2] = 256  # builtin:tiny has 256 tokens
        with self.assertRaisesRegex(ValueError, r"input_ids"):
            self.gpu.get_logprobs({"input_ids": bad})
        with self.assertRaisesRegex(ValueError, r"token_mask"):
            self.gpu.get_logprobs({"input_ids": torch.from_numpy(ids).cuda(),
                                   "token_mask": torch.ones(ids.shape[0], ids.shape[1] + 1, device="cuda")})
        # A broadcast view of 2^33 ids stores one: refused before any result of its size is allocated.
        huge = torch.zeros(1, 1, dtype=torch.int64, device="cuda").expand(2**20, 2**13)
        with self.assertRaisesRegex(ValueError, r"input_ids: shape \(1048576, 8192\): more than"):
            self.gpu.get_logprobs({"input_ids": huge})
        # The worker is still usable.
        self.assertEqual(self.gpu.get_logprobs({"input_ids": ids})["logprobs"].shape, ids.shape)


@unittest.skipIf(SKIP is not None, SKIP or "")
class TestGpuTrain(unittest.TestCase):
    def batch(self, rng, n=4):
        ids, lengths = padded_ids(random_rows(rng, n), rng=rng)
        return {"input_ids": ids, "input_lengths": lengths, "token_mask": rng.integers(0, 2, ids.shape) | (
            np.arange(ids.shape[1]) == 1)}

    def test_torch_cuda_batch_trains_as_numpy(self):
        import torch

        rng = np.random.default_rng(SEED + 12)
        batches = [self.batch(rng) for _ in range(2)]
        a, b = ringtrain.PolicyWorker(gpu_config()), ringtrain.PolicyWorker(gpu_config())
        for step, batch in enumerate(batches):
            ra = a.train(batch)
            rb = b.train({k: torch.from_numpy(np.asarray(v)).cuda() for k, v in batch.items()})
            for key in ("loss", "grad_norm", "lr", "valid_tokens"):
                self.assertTrue(math.isfinite(ra[key]), key)
                self.assertAlmostEqual(rb[key], ra[key], delta=1e-5 * max(1.0, abs(ra[key])), msg=f"{step} {key}")
            self.assertFalse(ra["skipped"] or rb["skipped"])
        # The steps changed the weights: the scores moved, equally in both.
        ids = batches[0]["input_ids"]
        la, lb = a.get_logprobs({"input_ids": ids})["logprobs"], b.get_logprobs({"input_ids": ids})["logprobs"]
        np.testing.assert_allclose(lb, la, rtol=0, atol=1e-3)
        start = ringtrain.PolicyWorker(gpu_config()).get_logprobs({"input_ids": ids})["logprobs"]
        self.assertGreater(float(np.max(np.abs(la - start))), 1e-3)

    def test_cuda_clipped_pg_and_dpo_batches_train_as_numpy(self):
        import torch

        rng = np.random.default_rng(SEED + 13)
        for loss in ("clipped_pg", "dpo"):
            cfg = gpu_config()
            cfg["loss_fn"] = {"type": loss, "reference_policy_kl_penalty": 0.1}  # DPO's beta
            if loss == "clipped_pg":
                cfg["loss_fn"].update(use_importance_sampling_correction=True)
            n = 8 if loss == "dpo" else 4  # four pairs as train_global_batch_size 4
            batch = self.batch(rng, n)
            shape = batch["input_ids"].shape
            for key in ("prev_logprobs", "reference_logprobs", "generation_logprobs"):
                batch[key] = (-rng.random(shape) * 3).astype(np.float32)
            batch["advantages"] = rng.standard_normal(shape[0]).astype(np.float32)
            batch["sample_mask"] = (np.arange(shape[0]) // 2 != 1).astype(np.float32)
            a, b = ringtrain.PolicyWorker(cfg), ringtrain.PolicyWorker(cfg)
            ra = a.train(batch)
            rb = b.train({k: torch.from_numpy(np.asarray(v)).cuda() for k, v in batch.items()})
            for key in ("loss", "grad_norm", "valid_tokens", "valid_sequences"):
                self.assertTrue(math.isfinite(ra[key]), f"{loss} {key}")
                self.assertAlmostEqual(rb[key], ra[key], delta=1e-5 * max(1.0, abs(ra[key])), msg=f"{loss} {key}")
            self.assertEqual(sorted(rb["metrics"]), sorted(ra["metrics"]), loss)
            for name, value in ra["metrics"].items():
                self.assertAlmostEqual(rb["metrics"][name], value, delta=1e-5 * max(1.0, abs(value)),
                                       msg=f"{loss} {name}")

    def test_a_bad_cuda_train_batch_raises_naming_the_entry(self):
        import torch

        rng = np.random.default_rng(SEED + 14)
        worker = ringtrain.PolicyWorker(gpu_config())
        batch = {k: torch.from_numpy(np.asarray(v)).cuda() for k, v in self.batch(rng).items()}
        batch["token_mask"] = batch["token_mask"].float()
        batch["token_mask"][2, 1] = 0.5
        with self.assertRaisesRegex(ringtrain.Error, r"token_mask\[2, 1\] is neither 0 nor 1"):
            worker.train(batch)
        batch["token_mask"][2, 1] = 1
        batch["sample_mask"] = torch.ones(4, 2, device="cuda")
        with self.assertRaisesRegex(ValueError, r"train: sample_mask: shape"):
            worker.train(batch)
        batch["sample_mask"] = torch.ones(4, device="cuda", dtype=torch.bool)
        self.assertTrue(math.isfinite(worker.train(batch)["loss"]))

    def test_first_step_equals_the_cli_on_the_gpu(self):
        rng = np.random.default_rng(SEED + 13)
        rows = [{"input_ids": r, "token_mask": [1.0] + rng.integers(0, 2, len(r) - 1).astype(float).tolist()}
                for r in random_rows(rng, 6)]
        cfg = gpu_config(train_global_batch_size=4, train_micro_batch_size=2)
        with tempfile.TemporaryDirectory() as tmp:
            data = os.path.join(tmp, "rows.jsonl")
            with open(data, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
            cfg["train"]["data"] = data
            path = write_config(os.path.join(tmp, "gpu.yaml"), cfg)
            run_cli("train", "--config", path, f"train.metrics_dir={tmp}", "train.steps=1", "train.checkpoint_dir=",
                    "train.checkpoint_every=0", "--no-progress")
            want = read_jsonl(os.path.join(tmp, "metrics.jsonl"))[0]
            units = ringtrain.BatchSchedule(len(rows), 4, SEED).step_units(0)
            r = ringtrain.PolicyWorker(path).train(rows_to_batch([rows[u] for u in units]))
        for key in ("loss", "grad_norm", "lr", "valid_tokens"):
            self.assertTrue(math.isfinite(r[key]), key)
            self.assertAlmostEqual(r[key], want[key], delta=1e-5 * max(1.0, abs(want[key])), msg=key)

if __name__ == "__main__":
    unittest.main()


def torchrun_skip_reason():
    if SKIP is not None:
        return SKIP
    import torch

    if torch.cuda.device_count() < 2:
        return f"needs 2 GPUs for two ranks, found {torch.cuda.device_count()}"
    if importlib.util.find_spec("torch.distributed.run") is None:
        return "torch.distributed.run (torchrun) is not available"
    return None


@unittest.skipIf(torchrun_skip_reason() is not None, torchrun_skip_reason() or "")
class TestTorchrun(unittest.TestCase):
    """Two processes under torchrun, one GPU and one worker each (dp = 2): both ranks return the same step, CUDA
    tensors train as NumPy arrays do (1e-5: the backward's atomics), and the scores agree on both ranks."""

    def test_two_ranks_train_alike(self):
        import subprocess

        here = os.path.dirname(os.path.abspath(__file__))
        with tempfile.TemporaryDirectory() as tmp:
            prefix = os.path.join(tmp, "rank")
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
            proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                                   "--master_port", "29517", os.path.join(here, "torchrun_rank.py"), prefix],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
            self.assertEqual(proc.returncode, 0, proc.stdout[-4000:])
            ranks = []
            for r in range(2):
                with open(f"{prefix}.{r}") as f:
                    ranks.append(json.load(f))
        for got in ranks:
            self.assertEqual(got["world_size"], 2)
            for key in ("loss", "grad_norm", "valid_tokens"):
                want = ranks[0]["numpy"][key]
                self.assertTrue(math.isfinite(want), key)
                for name in ("numpy", "cuda"):
                    self.assertAlmostEqual(got[name][key], want, delta=1e-5 * max(1.0, abs(want)),
                                           msg=f"rank {got['rank']} {name} {key}")
            np.testing.assert_allclose(np.array(got["cuda"]["logprobs"]), np.array(ranks[0]["numpy"]["logprobs"]),
                                       rtol=0, atol=1e-3)
