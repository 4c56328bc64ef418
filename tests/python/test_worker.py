"""The ringtrain module against the C++ CLI and against independent values: every method, dtypes, shapes, errors."""

import json
import math
import os
import re
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import numpy as np

import ringtrain
from common import (SEED, SOURCE_DIR, base_config, cli_logprobs, padded_ids, random_rows, read_jsonl,
                    rows_to_batch, run_cli, write_config)

GRPO_YAML = os.path.join(SOURCE_DIR, "configs", "grpo.yaml")
GRPO_DATA = os.path.join(SOURCE_DIR, "configs", "data", "grpo.jsonl")
SFT_YAML = os.path.join(SOURCE_DIR, "configs", "sft.yaml")
SFT_DATA = os.path.join(SOURCE_DIR, "configs", "data", "sft.jsonl")


def assert_valid_logprobs(test, lp, lengths, width):
    test.assertIsInstance(lp, np.ndarray)
    test.assertEqual(lp.dtype, np.float32)
    test.assertEqual(lp.shape, (len(lengths), width))
    test.assertTrue(np.all(np.isfinite(lp)), "a logprob is not finite")
    test.assertTrue(np.all(lp <= 0))
    for b, n in enumerate(lengths):
        test.assertEqual(lp[b, 0], 0.0)
        test.assertTrue(np.all(lp[b, n:] == 0), "padding is not 0")
        if n > 1:
            test.assertTrue(np.all(lp[b, 1:n] < 0), "a scored token has logprob 0")


def assert_rows_close(test, got, rows_expected, tol=1e-6):
    for b, exp in enumerate(rows_expected):
        exp = np.asarray(exp, np.float64)
        test.assertTrue(np.all(np.isfinite(exp)))
        np.testing.assert_allclose(got[b, :len(exp)], exp, rtol=0, atol=tol, err_msg=f"row {b}")


class TestConfig(unittest.TestCase):
    def test_dict_and_yaml_file_load_the_same(self):
        cfg = base_config()
        with tempfile.TemporaryDirectory() as tmp:
            path = write_config(os.path.join(tmp, "c.yaml"), cfg)
            from_file = ringtrain.load_config(path, ["policy.train_micro_batch_size=1"])
        from_dict = ringtrain.load_config(cfg, ["policy.train_micro_batch_size=1"])
        self.assertEqual(from_file, from_dict)
        self.assertIn("train_micro_batch_size: 1", from_dict)
        self.assertIn(f"seed: {SEED}", from_dict)

    def test_overrides_reach_the_worker(self):
        w = ringtrain.PolicyWorker(base_config(), ["policy.logprob_batch_size=2", "train.seed=5"])
        self.assertIn("logprob_batch_size: 2", w.config)
        self.assertIn("seed: 5", w.config)
        self.assertEqual(w.model_config["vocab_size"], 256)
        self.assertEqual((w.rank, w.world_size, w.local_ranks, w.device, w.steps_taken), (0, 1, 1, "cpu", 0))

    def test_unknown_key_names_it(self):
        cfg = base_config()
        cfg["policy"]["train_micro_batchsize"] = 2
        with self.assertRaisesRegex(ValueError, "policy.train_micro_batchsize"):
            ringtrain.PolicyWorker(cfg)
        with self.assertRaisesRegex(ValueError, "policy.logprob_batchsize"):
            ringtrain.PolicyWorker(base_config(), ["policy.logprob_batchsize=2"])

    def test_bad_values_and_arguments(self):
        with self.assertRaisesRegex(ValueError, "policy.train_micro_batch_size"):
            ringtrain.PolicyWorker(base_config(), ["policy.train_micro_batch_size=abc"])
        with self.assertRaisesRegex(ValueError, "builtin:nope"):
            ringtrain.PolicyWorker(base_config(model_name="builtin:nope"))
        with self.assertRaisesRegex(FileNotFoundError, "config: no such file: /nonexistent/run.yaml"):
            ringtrain.PolicyWorker("/nonexistent/run.yaml")
        with tempfile.TemporaryDirectory() as tmp:
            with self.assertRaisesRegex(IsADirectoryError, f"config: {tmp} is a directory; expected a YAML file"):
                ringtrain.PolicyWorker(tmp)
        with self.assertRaisesRegex(ValueError, r"config: the path '/tmp/a\\x00b.yaml' holds a NUL character"):
            ringtrain.PolicyWorker("/tmp/a\0b.yaml")
        with self.assertRaises(TypeError):
            ringtrain.PolicyWorker(base_config(), "policy.train_micro_batch_size=2")
        with self.assertRaises(TypeError):
            ringtrain.PolicyWorker(42)

    def test_dict_values_from_numpy_and_bad_values_are_named(self):
        cfg = base_config()
        cfg["policy"]["train_micro_batch_size"] = np.int64(1)
        cfg["policy"]["max_grad_norm"] = np.float32(0.5)
        cfg["policy"]["optimizer"] = {"kwargs": {"betas": (np.float64(0.8), 0.9)}}
        resolved = ringtrain.load_config(cfg)
        self.assertIn("train_micro_batch_size: 1", resolved)
        self.assertIn("max_grad_norm: 0.5", resolved)
        self.assertRegex(resolved, r"betas: \[0.8, 0.9\]")
        for value, pattern in ((object(), r"policy.max_grad_norm: expected a number, str, bool, None, list or dict, "
                                          r"got object"),
                               (np.zeros(2), r"policy.max_grad_norm: .*got ndarray"),
                               ({1: 2}, r"policy.max_grad_norm: keys must be str, got int")):
            cfg = base_config()
            cfg["policy"]["max_grad_norm"] = value
            with self.assertRaisesRegex(TypeError, pattern):
                ringtrain.load_config(cfg)
        # A str is a string, though it spells a number or a flag.
        for key, value, want in (("train_global_batch_size", "2", "an integer"), ("max_grad_norm", "0.5", "a number")):
            cfg = base_config()
            cfg["policy"][key] = value
            with self.assertRaisesRegex(ValueError, rf'policy.{key} = "{value}": a string; expected {want}'):
                ringtrain.load_config(cfg)
        deep = base_config()
        node = deep["train"]
        for _ in range(100):
            node["x"] = {}
            node = node["x"]
        with self.assertRaisesRegex(ValueError, r"train\.x\.x.*nested more than 64 levels deep"):
            ringtrain.PolicyWorker(deep)
        looped = base_config()
        looped["policy"]["self"] = looped["policy"]
        looped["train"]["items"] = [1]
        looped["train"]["items"].append(looped["train"]["items"])
        with self.assertRaisesRegex(ValueError, r"^policy\.self: a dict or list inside itself"):
            ringtrain.load_config(looped)
        del looped["policy"]["self"]
        with self.assertRaisesRegex(ValueError, r"^train\.items\[1\]: a dict or list inside itself"):
            ringtrain.load_config(looped)
        shared = base_config()
        shared["train"]["a"] = shared["train"]["b"] = [1, 2]  # the same list twice, not inside itself: no loop
        with self.assertRaisesRegex(ValueError, r"train\.a"):  # refused as an unknown key, not as a loop
            ringtrain.load_config(shared)

    def test_hostile_timeouts_and_override_bytes_are_named(self):
        # Refused before the seconds become an int64 of milliseconds (NaN, inf and 1e300 do not fit one).
        for t in (float("nan"), float("inf"), 1e300, -1.0, 0.0, 1e-4):
            with self.assertRaisesRegex(ValueError, r"timeout_s = .*: expected seconds in \[0.001, 604800\]"):
                ringtrain.PolicyWorker(base_config(), timeout_s=t)
        for t in (None, "10", True):
            with self.assertRaisesRegex(TypeError, r"timeout_s: expected a number, got"):
                ringtrain.PolicyWorker(base_config(), timeout_s=t)
        # A NUL would end the YAML value early: seed 1 instead of the 1<NUL>2 given.
        with self.assertRaisesRegex(ValueError, r"override 'train.seed=1\\x002': holds a NUL byte"):
            ringtrain.PolicyWorker(base_config(), ["train.seed=1\x002"])
        cfg = base_config()
        cfg["attention"] = {"backends": ["math", "math"]}
        with self.assertRaisesRegex(ValueError, r"attention.backends\[1\] = math: listed twice"):
            ringtrain.PolicyWorker(cfg)

    def test_text_that_is_not_utf8_comes_back_as_its_bytes(self):
        # Bytes that are no UTF-8 in a value (a Latin-1 path) reach the config as given and come back, in the YAML
        # and in messages, as surrogate escapes of those bytes; a lone surrogate that stands for no byte is refused.
        yaml = ringtrain.load_config(base_config(), ["train.data=/data/caf\udce9.jsonl"])
        self.assertIn(b"data: /data/caf\xe9.jsonl", os.fsencode(yaml))
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(os.fsencode(tmp), b"conf\xffig.yaml")
            with open(path, "wb") as f:
                f.write(b"policy:\n  model_name: /no/such/mod\xffel\ndevice: cpu\n")
            with self.assertRaises(ValueError) as caught:
                ringtrain.PolicyWorker(path)
            self.assertIn(b"/no/such/mod\xffel/config.json: No such file or directory",
                          os.fsencode(str(caught.exception)))
        with self.assertRaisesRegex(ValueError, r"overrides: 'train.data=\\ud800' holds '\\ud800', which is not UTF-8"):
            ringtrain.load_config(base_config(), ["train.data=\ud800"])


class TestLogprobs(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        config = base_config()
        cls.worker = ringtrain.PolicyWorker(config)  # no train.data: the worker alone needs none
        config["train"]["data"] = SFT_DATA  # `ringtrain logprobs --config` reads run files, which name their data
        cls.config_path = write_config(os.path.join(cls.tmp.name, "run.yaml"), config)
        cls.rng = np.random.default_rng(SEED)
        cls.rows = random_rows(cls.rng, 7)
        cls.cli = cli_logprobs(cls.config_path, cls.rows, cls.tmp.name)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_matches_the_cli(self):
        ids, lengths = padded_ids(self.rows, rng=self.rng)
        lp = self.worker.get_logprobs({"input_ids": ids, "input_lengths": lengths})["logprobs"]
        assert_valid_logprobs(self, lp, lengths, ids.shape[1])
        assert_rows_close(self, lp, self.cli)
        # The scores depend on the tokens: two rows never agree and the CLI values are not all alike.
        self.assertGreater(np.ptp(np.concatenate([np.asarray(c[1:]) for c in self.cli])), 0.1)

    def test_dtypes_layouts_and_containers_agree(self):
        ids, lengths = padded_ids(self.rows, fill=0)
        want = self.worker.get_logprobs({"input_ids": ids, "input_lengths": lengths})["logprobs"]
        for dtype in (np.int32, np.int64, np.int16, np.uint8, np.uint16, np.uint32, np.uint64):
            got = self.worker.get_logprobs({"input_ids": ids.astype(dtype), "input_lengths": lengths.astype(dtype)})
            np.testing.assert_array_equal(got["logprobs"], want, err_msg=str(dtype))
        fortran = np.asfortranarray(ids)
        strided = np.zeros((ids.shape[0] * 2, ids.shape[1] * 3), np.int64)[::2, ::3]
        strided[...] = ids
        for variant in (fortran, strided, memoryview(ids.astype(np.int32)), ids.tolist()):
            got = self.worker.get_logprobs({"input_ids": variant, "input_lengths": list(lengths)})
            np.testing.assert_array_equal(got["logprobs"], want, err_msg=type(variant).__name__)

    def test_padding_and_masks_do_not_change_scores(self):
        # input_lengths absent: every row is S long. Row b scored alone equals row b of a padded batch.
        ids, lengths = padded_ids(self.rows, rng=self.rng)
        batch = self.worker.get_logprobs({"input_ids": ids, "input_lengths": lengths,
                                          "token_mask": self.rng.integers(0, 2, ids.shape).astype(bool)})["logprobs"]
        for b in (0, 3):
            alone = self.worker.get_logprobs({"input_ids": ids[b:b + 1, :lengths[b]]})["logprobs"]
            self.assertEqual(alone.shape, (1, lengths[b]))
            np.testing.assert_array_equal(alone[0], batch[b, :lengths[b]])

    def test_entropy(self):
        ids, lengths = padded_ids(self.rows, rng=self.rng)
        out = self.worker.get_logprobs({"input_ids": ids, "input_lengths": lengths}, with_entropy=True)
        self.assertEqual(sorted(out), ["entropy", "logprobs"])
        assert_rows_close(self, out["logprobs"], self.cli)
        ent = out["entropy"]
        self.assertEqual((ent.dtype, ent.shape), (np.float32, ids.shape))
        self.assertTrue(np.all(np.isfinite(ent)))
        for b, n in enumerate(lengths):
            self.assertTrue(np.all(ent[b, n:] == 0))
            self.assertTrue(np.all(ent[b, 1:n] > 0) and np.all(ent[b, 1:n] <= math.log(256) + 1e-5))
            # H = -sum p log p >= -log max p >= the logprob of any one token, negated: H >= 0 and a random token's
            # -logprob is within [0, inf); a near-uniform random model has H close to log(vocab).
            self.assertLess(abs(float(np.mean(ent[b, 1:n])) - math.log(256)), 1.0)

    def test_reference_logprobs_are_the_starting_weights(self):
        ids, lengths = padded_ids(self.rows, rng=self.rng)
        ref = self.worker.get_reference_logprobs({"input_ids": ids, "input_lengths": lengths})
        self.assertEqual(list(ref), ["reference_logprobs"])
        assert_rows_close(self, ref["reference_logprobs"], self.cli)


class TestMultiRank(unittest.TestCase):
    """configs/grpo.yaml: cp = 2 (two in-process ranks), packed scoring; dp = 2 x cp = 2 through an override."""

    def test_logprobs_match_the_cli(self):
        rng = np.random.default_rng(SEED + 1)
        rows = random_rows(rng, 6, max_len=200)
        for overrides in ([f"train.seed={SEED}"], [f"train.seed={SEED}", "parallel.dp=2"]):
            with self.subTest(overrides=overrides), tempfile.TemporaryDirectory() as tmp:
                w = ringtrain.PolicyWorker(GRPO_YAML, overrides)
                self.assertEqual((w.world_size, w.local_ranks), (2 * (1 + ("parallel.dp=2" in overrides)),) * 2)
                cli = cli_logprobs(GRPO_YAML, rows, tmp, *overrides)
                ids, lengths = padded_ids(rows, rng=rng, dtype=np.int32)
                lp = w.get_logprobs({"input_ids": ids, "input_lengths": lengths})["logprobs"]
                assert_valid_logprobs(self, lp, lengths, ids.shape[1])
                assert_rows_close(self, lp, cli)

    def test_bad_input_leaves_the_ranks_usable(self):
        w = ringtrain.PolicyWorker(GRPO_YAML, [f"train.seed={SEED}"])
        with self.assertRaisesRegex(ValueError, "input_ids"):
            w.get_logprobs({"input_ids": np.array([[1, 999]])})
        lp = w.get_logprobs({"input_ids": np.array([[1, 2, 3]])})["logprobs"]
        self.assertTrue(np.all(lp[0, 1:] < 0))

    def test_paths_that_every_rank_refuses_leave_the_ranks_usable(self):
        # dp = 2 x cp = 2: every rank reaches the same verdict on a save, load or export path, so the group stays in
        # step and the next call runs.
        w = ringtrain.PolicyWorker(GRPO_YAML, [f"train.seed={SEED}", "parallel.dp=2"])
        ids = np.array([[1, 2, 3, 4]])
        before = w.get_logprobs({"input_ids": ids})["logprobs"]
        with tempfile.TemporaryDirectory() as tmp:
            a_file = os.path.join(tmp, "a-file")
            with open(a_file, "w") as f:
                f.write("keep")
            for call, pattern in [(lambda: w.load(os.path.join(tmp, "missing")), r"missing/trainer_state\.json"),
                                  (lambda: w.save(a_file), "not a checkpoint folder"),
                                  (lambda: w.export_hf(a_file), "is not a directory"),
                                  (lambda: w.save(""), "empty folder name")]:
                with self.assertRaisesRegex(ringtrain.Error, pattern):
                    call()
                np.testing.assert_array_equal(w.get_logprobs({"input_ids": ids})["logprobs"], before)
            with open(a_file) as f:
                self.assertEqual(f.read(), "keep")

    def test_a_batch_the_ranks_refuse_leaves_them_usable_and_an_empty_one_moves_nothing(self):
        # DPO over dp = 2: a pair whose masks differ is named (a ValueError, before any rank sees the batch, as every
        # other bad entry), and the group trains on; a batch whose masks leave no valid token is reported skipped
        # and leaves the logprobs as they were.
        w = ringtrain.PolicyWorker(os.path.join(SOURCE_DIR, "configs", "dpo.yaml"),
                                   ["policy.train_global_batch_size=2", "policy.train_micro_batch_size=1"])
        ids = np.random.default_rng(SEED).integers(1, 200, (4, 12))
        for mask, pair in [([1, 0, 1, 1], 0), ([1, 1, 0, 1], 1), ([1, 1, 1, 0], 1)]:
            with self.assertRaisesRegex(ValueError, rf"train: sample_mask: DPO pair {pair} \(rows {2 * pair} and "
                                                    rf"{2 * pair + 1}\) has {mask[2 * pair]} on the chosen"):
                w.train({"input_ids": ids, "sample_mask": np.array(mask, np.float32)})
        before = w.get_logprobs({"input_ids": ids})["logprobs"]
        r = w.train({"input_ids": ids, "sample_mask": np.zeros(4, np.float32)})
        self.assertEqual((r["skipped"], r["valid_tokens"]), (True, 0))
        # No pair counted: the metrics have no value (NaN, null in metrics.jsonl), not a 0 that reads as measured.
        self.assertIn("reward_accuracy", r["metrics"])
        self.assertTrue(all(math.isnan(v) for v in r["metrics"].values()), r["metrics"])
        np.testing.assert_array_equal(w.get_logprobs({"input_ids": ids})["logprobs"], before)
        r = w.train({"input_ids": ids})
        self.assertFalse(r["skipped"])
        self.assertTrue(all(math.isfinite(v) for v in r["metrics"].values()), r["metrics"])
        self.assertTrue(math.isfinite(r["loss"]) and r["valid_tokens"] > 0)
        self.assertFalse(np.array_equal(w.get_logprobs({"input_ids": ids})["logprobs"], before))


class TestBadInputs(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.worker = ringtrain.PolicyWorker(base_config(), ["policy.train_global_batch_size=2",
                                                            "policy.train_micro_batch_size=1"])
        cls.ids = np.random.default_rng(SEED).integers(0, 256, (2, 6))

    def bad(self, batch, pattern, exc=ValueError, method="get_logprobs"):
        if pattern is None:
            self.assertTrue(np.all(np.isfinite(getattr(self.worker, method)(batch)["logprobs"])))
            return
        with self.assertRaisesRegex(exc, pattern):
            getattr(self.worker, method)(batch)

    def test_an_array_that_empties_the_batch_while_it_is_read(self):
        # __dlpack__ runs Python code in the middle of reading the batch: the batch is read from a copy that holds
        # every value, so clearing the caller's dict changes nothing.
        batch = {}

        class Clearing(np.ndarray):
            def __dlpack__(self, *args, **kwargs):
                batch.clear()
                raise BufferError("no DLPack here")

        batch.update(token_mask=np.ones((2, 6), np.float32).view(Clearing), input_ids=self.ids)
        expected = self.worker.get_logprobs({"input_ids": self.ids})["logprobs"]
        np.testing.assert_array_equal(self.worker.get_logprobs(batch)["logprobs"], expected)
        self.assertEqual(batch, {})

    def test_running_out_of_host_memory_says_what_would_need_less(self):
        # In a child process whose address space is capped 300 MB above what it uses: 65,536 rows of 48 tokens need
        # gigabytes of logits. The worker is usable after it.
        script = """
import os, resource, numpy as np, ringtrain, sys
cfg = {"policy": {"model_name": "builtin:tiny", "train_global_batch_size": 2, "train_micro_batch_size": 1,
                  "max_total_sequence_length": 48, "logprob_batch_size": 65536}, "device": "cpu"}
w = ringtrain.PolicyWorker(cfg)
used = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
resource.setrlimit(resource.RLIMIT_AS, (used + (300 << 20), resource.RLIM_INFINITY))
try:
    w.get_logprobs({"input_ids": np.ones((1 << 16, 48), np.int64)})
    print("no error")
except MemoryError as e:
    print("MemoryError:", e)
print("after:", w.get_logprobs({"input_ids": np.ones((2, 4), np.int64)})["logprobs"].shape)
"""
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                             env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("MemoryError: out of host memory (std::bad_alloc); a smaller batch, policy.logprob_batch_size",
                      out.stdout)
        self.assertIn("after: (2, 4)", out.stdout)

    def test_an_interrupt_while_an_array_is_read_reaches_the_caller_as_itself(self):
        # Ctrl-C (or a MemoryError) inside the caller's __dlpack__ is not an error about the array.
        for raised in (KeyboardInterrupt, MemoryError):
            class Raising(np.ndarray):
                def __dlpack__(self, *args, **kwargs):
                    raise raised()

            with self.assertRaises(raised):
                self.worker.get_logprobs({"input_ids": self.ids, "token_mask": np.ones((2, 6)).view(Raising)})
        self.assertTrue(np.all(self.worker.get_logprobs({"input_ids": self.ids})["logprobs"][:, 1:] < 0))

    def test_the_zero_copy_path_is_for_cuda_tensors_of_a_gpu_worker(self):
        # A CPU worker's in-process ranks would share one result tensor: it never takes the zero-copy path.
        self.assertEqual(self.worker._w.zero_copy_device, -1)
        for ids, pattern in ((self.ids, "input_ids: expected a CUDA tensor$"),
                             ([[1, 2]], "input_ids: expected a CUDA tensor, got list")):
            with self.assertRaisesRegex(TypeError, pattern):
                self.worker._w.get_logprobs_cuda({"input_ids": ids}, False)
        with self.assertRaisesRegex(ValueError, "unknown batch key 'ids'"):
            self.worker._w.get_reference_logprobs_cuda({"ids": self.ids})
        with self.assertRaisesRegex(ValueError, "has no 'input_ids'"):
            self.worker._w.get_reference_logprobs_cuda({})

    def test_every_bad_input_raises_naming_the_field(self):
        ids = self.ids
        f32 = lambda shape: np.zeros(shape, np.float32)  # noqa: E731
        self.bad({"input_ids": ids.astype(np.float32)}, r"input_ids: expected an integer dtype, got float32")
        self.bad({"input_ids": ids.astype(bool)}, r"input_ids: expected an integer dtype, got bool")
        self.bad({"input_ids": ids[0]}, r"input_ids: expected shape \[B, S\], got \(6,\)")
        self.bad({"input_ids": np.zeros((0, 4), np.int64)}, r"input_ids: the batch is empty")
        too_big = ids.copy()
        too_big[1, 2] = 256
        self.bad({"input_ids": too_big}, r"input_ids\[1, 2\] = 256 is not a token id in \[0, 256\)")
        self.bad({"input_ids": too_big, "input_lengths": np.array([6, 2])}, None)  # past the length: ignored
        self.bad({"input_ids": -np.ones((1, 3), np.int64)}, r"input_ids\[0, 0\] = -1 is not a token id")
        self.bad({"input_ids": np.zeros((1, 49), np.int64)}, r"sample 0 has 49 tokens; policy.max_total_sequence")
        self.bad({"input_ids": ids, "input_lengths": np.array([3, 7])}, r"input_lengths\[1\] = 7 is not in \[1, S = 6\]")
        self.bad({"input_ids": ids, "input_lengths": np.array([0, 2])}, r"input_lengths\[0\] = 0")
        self.bad({"input_ids": ids, "input_lengths": np.array([2.0, 2.0])}, r"input_lengths: expected an integer dtype")
        self.bad({"input_ids": ids, "input_lengths": np.array([2, 2, 2])}, r"input_lengths: shape \(3,\) does not match")
        self.bad({"input_ids": ids, "token_mask": np.ones((2, 7))}, r"token_mask: shape \(2, 7\) does not match input")
        self.bad({"input_ids": ids, "token_mask": np.full((2, 6), 2)}, r"token_mask\[0, 0\] = 2: expected 0 or 1")
        self.bad({"input_ids": ids, "sample_mask": np.ones(3)}, r"sample_mask: shape \(3,\) does not match")
        self.bad({"input_ids": ids, "sample_mask": np.array([1, 0.5])}, r"sample_mask\[1\] = 0.5: expected 0 or 1")
        self.bad({"input_ids": ids, "advantages": np.ones((2, 6), np.int64)},
                 r"advantages: expected a floating dtype, got int64")
        self.bad({"input_ids": ids, "advantages": f32((2, 5))}, r"advantages: shape \(2, 5\) does not match")
        nan = f32((2, 6))
        nan[1, 4] = np.nan
        self.bad({"input_ids": ids, "advantages": nan}, r"advantages\[1, 4\] = nan: not a finite float32")
        inf = f32((2, 6))
        inf[0, 1] = -np.inf
        self.bad({"input_ids": ids, "generation_logprobs": inf}, r"generation_logprobs\[0, 1\] = -inf: not a finite")
        self.bad({"input_ids": ids, "prev_logprobs": f32(2)}, r"prev_logprobs: shape \(2,\) does not match")
        positive = f32((2, 6))
        positive[1, 3] = 0.25
        self.bad({"input_ids": ids, "prev_logprobs": positive}, r"prev_logprobs\[1, 3\] = 0.25: a log-probability is at most 0")
        self.bad({"input_ids": ids, "input_lengths": np.array([6, 3]), "prev_logprobs": positive}, None)
        self.bad({"input_ids": ids, "reference_logprobs": np.zeros((2, 6), np.int32)},
                 r"reference_logprobs: expected a floating dtype")
        self.bad({"input_ids": ids, "labels": ids}, r"unknown batch key 'labels'")
        self.bad({"token_mask": ids}, r"the batch has no 'input_ids'")
        self.bad({"input_ids": "1 2 3"}, r"input_ids: expected an array", TypeError)
        self.bad({"input_ids": [[1, 2], [3]]}, r"input_ids: cannot make an array")
        self.bad([ids], r"the batch must be a dict", TypeError)
        self.bad({1: ids}, r"batch keys must be strings", TypeError)
        self.bad({"input_ids": ids.astype(np.float64)}, r"get_reference_logprobs: input_ids: expected an integer",
                 method="get_reference_logprobs")

    def test_a_dlpack_device_that_is_not_a_pair_of_ints_is_named(self):
        ids = self.ids

        class Odd:
            def __init__(self, device):
                self.device = device

            def __dlpack__(self, *args, **kwargs):
                return ids.__dlpack__()

            def __dlpack_device__(self):
                if isinstance(self.device, Exception):
                    raise self.device
                return self.device

        for device in [(1,), (1, 0, 0), "cpu", None, [1, 0]]:
            self.bad({"input_ids": Odd(device)}, r"input_ids: __dlpack_device__\(\) returned .*, not a "
                                                 r"\(device_type, device_id\) pair")
        for device in [(1, "0"), (1.5, 0), (2**70, 0)]:
            self.bad({"input_ids": Odd(device)}, r"input_ids: __dlpack_device__\(\) returned a pair that is not two ints")
        self.bad({"input_ids": Odd(OSError("gone"))}, r"input_ids: __dlpack_device__\(\) failed: OSError: gone")
        self.bad({"input_ids": Odd((1, 0))}, None)  # a CPU pair reads as the array itself

    def test_hostile_sizes_values_and_flags_are_named_before_any_large_allocation(self):
        ids = self.ids
        # uint64 above 2^63 (and int64 beyond what a double holds exactly): the value as written, not a wrapped one.
        big = ids.astype(np.uint64)
        big[0, 1] = np.uint64(2**64 - 1)
        self.bad({"input_ids": big}, r"input_ids\[0, 1\] = 18446744073709551615 is not a token id")
        big[0, 1] = np.uint64(2**63 + 5)
        self.bad({"input_ids": big}, r"input_ids\[0, 1\] = 9223372036854775813 is not a token id")
        huge = ids.copy()
        huge[1, 0] = 2**62 + 1
        self.bad({"input_ids": huge}, r"input_ids\[1, 0\] = 4611686018427387905 is not a token id")
        self.bad({"input_ids": ids, "input_lengths": np.array([2**64 - 1, 2], np.uint64)},
                 r"input_lengths\[0\] = 18446744073709551615 is not in \[1, S = 6\]")
        # Broadcast views of 2^40 and more elements: refused by their shape, nothing of their size allocated.
        one = np.ones((1, 1), np.int64)
        self.bad({"input_ids": np.broadcast_to(one, (1, 2**40))},
                 r"input_ids: sample 0 has 1099511627776 tokens; policy.max_total_sequence_length allows 1 to 48")
        self.bad({"input_ids": np.broadcast_to(one, (2**40, 4))}, r"input_ids: shape \(1099511627776, 4\): more than")
        self.bad({"input_ids": np.broadcast_to(one.astype(np.int8), (2**30, 2**32)), "input_lengths": [1]},
                 r"input_ids: shape \(1073741824, 4294967296\): more than")
        self.bad({"input_ids": ids, "token_mask": np.broadcast_to(np.ones((1, 1), bool), (2**31, 2**31))},
                 r"token_mask: shape \(2147483648, 2147483648\) does not match input_ids")
        # A broadcast of a legal shape reads in place.
        self.bad({"input_ids": np.broadcast_to(ids[:1], (2, 6))}, None)
        # with_entropy is a flag: True or False (NumPy's bool too), not any object's truth value.
        for flag in ("no", 1, None, [], 0.0):
            with self.assertRaisesRegex(TypeError, r"with_entropy: expected True or False"):
                self.worker.get_logprobs({"input_ids": ids}, with_entropy=flag)
        self.assertIn("entropy", self.worker.get_logprobs({"input_ids": ids}, with_entropy=np.bool_(True)))
        self.assertNotIn("entropy", self.worker.get_logprobs({"input_ids": ids}, with_entropy=False))

    def test_train_checks_the_batch_against_the_config(self):
        self.bad({"input_ids": self.ids[:1]}, r"train: input_ids: the batch holds 1 sequences; "
                 r"policy.train_global_batch_size = 2", method="train")
        self.bad({"input_ids": self.ids.astype(np.float32)}, r"train: input_ids: expected an integer", method="train")
        pg = ringtrain.PolicyWorker(GRPO_YAML, ["policy.train_global_batch_size=2", "policy.train_micro_batch_size=1"])
        with self.assertRaisesRegex(ValueError, "clipped_pg needs 'advantages'"):
            pg.train({"input_ids": self.ids})
        with self.assertRaisesRegex(ValueError, "use_importance_sampling_correction needs 'generation_logprobs'"):
            pg.train({"input_ids": self.ids, "advantages": np.ones(2, np.float32)})

    def test_worker_errors_are_ringtrain_errors_and_leave_it_usable(self):
        with self.assertRaises(ringtrain.Error) as caught:
            self.worker.load("/nonexistent/checkpoint")
        self.assertIsInstance(caught.exception, RuntimeError)
        self.assertIn("/nonexistent/checkpoint", str(caught.exception))
        # A path that is no UTF-8 keeps its message (a strict decode would leave it empty).
        with self.assertRaises(ringtrain.Error) as caught:
            self.worker.load(b"/nonexistent/\xffcheckpoint")
        self.assertIn(b"cannot open /nonexistent/\xffcheckpoint/trainer_state.json: No such file",
                      os.fsencode(str(caught.exception)))
        lp = self.worker.get_logprobs({"input_ids": self.ids})["logprobs"]
        self.assertTrue(np.all(lp[:, 1:] < 0))


class TestTrain(unittest.TestCase):
    def cli_first_step(self, config, data, tmp, overrides):
        run_cli("train", "--config", config, *overrides, f"train.data={data}", f"train.metrics_dir={tmp}",
                "train.steps=1", "train.checkpoint_dir=", "train.checkpoint_every=0", "--no-progress")
        return read_jsonl(os.path.join(tmp, "metrics.jsonl"))[0]

    def check_first_step(self, config, data, overrides):
        rows = read_jsonl(data)
        w = ringtrain.PolicyWorker(config, overrides)
        c = w.config
        gbs = int(c.split("train_global_batch_size: ")[1].split()[0])
        units = ringtrain.BatchSchedule(len(rows), gbs, SEED).step_units(0)
        self.assertEqual(len(units), gbs)
        r = w.train(rows_to_batch([rows[u] for u in units]))
        with tempfile.TemporaryDirectory() as tmp:
            want = self.cli_first_step(config, data, tmp, overrides)
        for key in ("loss", "grad_norm", "lr", "valid_tokens"):
            self.assertTrue(math.isfinite(r[key]), key)
            self.assertAlmostEqual(r[key], want[key], delta=1e-6 * max(1.0, abs(want[key])), msg=key)
        for name, value in r["metrics"].items():
            self.assertAlmostEqual(value, want[name], delta=1e-6 * max(1.0, abs(want[name])), msg=name)
        self.assertEqual((r["step"], r["skipped"], w.steps_taken), (1, False, 1))
        self.assertGreater(r["tokens_per_second"], 0)
        self.assertTrue(all(math.isfinite(x) for x in r["microbatch_losses"]))
        return r

    def test_grpo_first_step_equals_the_cli(self):
        # clipped PG with KL, importance sampling, dual clip; cp = 2 packed: prev and reference logprobs computed.
        r = self.check_first_step(GRPO_YAML, GRPO_DATA, [f"train.seed={SEED}"])
        self.assertIn("importance_weight", r["metrics"])

    def test_sft_first_step_equals_the_cli(self):
        overrides = [f"train.seed={SEED}", "parallel.dp=2", "policy.scheduler.total_steps=16"]
        self.check_first_step(SFT_YAML, SFT_DATA, overrides)


class TestCheckpoint(unittest.TestCase):
    def test_save_load_round_trip_and_export(self):
        rng = np.random.default_rng(SEED + 2)
        cfg = base_config()
        ids = rng.integers(0, 256, (4, 20))
        batches = [{"input_ids": rng.integers(0, 256, (4, 20)), "input_lengths": rng.integers(2, 21, 4),
                    "token_mask": rng.integers(0, 2, (4, 20))} for _ in range(2)]
        with tempfile.TemporaryDirectory() as tmp:
            a = ringtrain.PolicyWorker(cfg)
            start = a.get_logprobs({"input_ids": ids})["logprobs"]
            a.train(batches[0])
            after_one = a.get_logprobs({"input_ids": ids})["logprobs"]
            self.assertGreater(np.max(np.abs(after_one - start)), 1e-4, "a step changed nothing")
            a.save(os.path.join(tmp, "ckpt"), epoch=1, index=4, rng="python test")
            second_a = a.train(batches[1])

            b = ringtrain.PolicyWorker(cfg)
            self.assertEqual(b.load(os.path.join(tmp, "ckpt")), {"epoch": 1, "index": 4, "rng": "python test"})
            self.assertEqual(b.steps_taken, 1)
            np.testing.assert_array_equal(b.get_logprobs({"input_ids": ids})["logprobs"], after_one)
            np.testing.assert_array_equal(b.get_reference_logprobs({"input_ids": ids})["reference_logprobs"], start)
            second_b = b.train(batches[1])  # the optimizer state came back too
            self.assertEqual(second_a["loss"], second_b["loss"])
            self.assertEqual(second_a["grad_norm"], second_b["grad_norm"])
            final = b.get_logprobs({"input_ids": ids})["logprobs"]
            np.testing.assert_array_equal(a.get_logprobs({"input_ids": ids})["logprobs"], final)

            # export_hf: the folder the CLI scores, with the tensors refit_info lists.
            out = os.path.join(tmp, "hf")
            b.export_hf(out)
            rows = [list(map(int, r)) for r in ids]
            data = os.path.join(tmp, "rows.jsonl")
            with open(data, "w") as f:
                f.writelines(json.dumps({"input_ids": r}) + "\n" for r in rows)
            cli = [json.loads(x)["logprobs"] for x in run_cli("logprobs", "--model", out, "--data", data).splitlines()]
            assert_rows_close(self, final, cli)
            with open(os.path.join(out, "model.safetensors"), "rb") as f:
                header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
            header.pop("__metadata__", None)
            info = b.refit_info()
            self.assertEqual(sorted(e["name"] for e in info), sorted(header))
            for e in info:
                self.assertEqual(list(e["shape"]), header[e["name"]]["shape"], e["name"])
                self.assertEqual((e["dtype"], header[e["name"]]["dtype"]), ("float32", "F32"))
            self.assertEqual(info[0]["name"], "model.embed_tokens.weight")

    def test_save_arguments_are_checked_before_a_good_checkpoint_is_replaced(self):
        rng = np.random.default_rng(SEED + 21)
        w = ringtrain.PolicyWorker(base_config())
        w.train({"input_ids": rng.integers(0, 256, (4, 12))})
        with tempfile.TemporaryDirectory() as tmp:
            good = os.path.join(tmp, "good")
            w.save(good, epoch=2, index=3, rng="r")
            for kwargs, exc, pattern in [({"epoch": -1}, ValueError, "epoch = -1: expected an integer in"),
                                         ({"index": -5}, ValueError, "index = -5"),
                                         ({"epoch": 2**70}, ValueError, "epoch = 1180591620717411303424"),
                                         ({"epoch": 1.7}, TypeError, "epoch: expected an integer, got float"),
                                         ({"index": "3"}, TypeError, "index: expected an integer, got str"),
                                         ({"rng": None}, TypeError, "rng: expected a str, got NoneType"),
                                         ({"rng": b"ab"}, TypeError, "rng: expected a str, got bytes"),
                                         # kept in JSON: a surrogate escape of a byte is no text there
                                         ({"rng": "a\udcffb"}, ValueError, "rng: .* holds .*, which is not UTF-8")]:
                with self.subTest(**{k: repr(v) for k, v in kwargs.items()}):
                    with self.assertRaisesRegex(exc, pattern):
                        w.save(good, **kwargs)
            self.assertEqual(ringtrain.PolicyWorker(base_config()).load(good), {"epoch": 2, "index": 3, "rng": "r"})
            with self.assertRaisesRegex(ValueError, "path: the path .* holds a NUL byte"):
                w.save(os.path.join(tmp, "a\x00b"))
            self.assertEqual(sorted(os.listdir(tmp)), ["good"])
            # Linux allows any bytes but / and NUL in a name: a path that is not UTF-8 works too.
            odd = os.path.join(os.fsencode(tmp), b"ckpt\xff")
            w.save(odd, epoch=1)
            self.assertEqual(ringtrain.PolicyWorker(base_config()).load(odd)["epoch"], 1)

    def test_an_instance_made_without_init_raises(self):
        for cls, use in [(ringtrain._core.PolicyWorker, lambda o: o.rank),
                         (ringtrain._core.PolicyWorker, lambda o: o.refit_info()),
                         (ringtrain._core.BatchSchedule, lambda o: o.steps_per_epoch)]:
            with self.assertRaisesRegex(TypeError, "made without __init__"):
                use(cls.__new__(cls))


class TestGenerate(unittest.TestCase):
    """worker.generate, the built-in sampler: its logprobs are the worker's own (the fp32 CPU policy: equal to
    get_logprobs on the same sequences to 1e-5), seeds reproduce, stop tokens end sequences, trained weights are
    the ones it samples from, and every bad argument is an error naming it."""

    @classmethod
    def setUpClass(cls):
        cls.rng = np.random.default_rng(SEED + 31)
        cls.worker = ringtrain.PolicyWorker(base_config(max_total_sequence_length=64))
        cls.prompts = [cls.rng.integers(0, 256, int(n)).tolist() for n in (3, 9, 1, 14)]

    def score(self, worker, prompts, gens):
        rows = [p + g["tokens"].tolist() for p, g in zip(prompts, gens)]
        ids, lengths = padded_ids(rows, fill=0)
        return worker.get_logprobs({"input_ids": ids, "input_lengths": lengths})["logprobs"]

    def test_samples_carry_the_policys_logprobs_and_seeds_reproduce(self):
        gens = self.worker.generate(self.prompts, 12, temperature=1.0, seed=SEED)
        self.assertEqual(len(gens), len(self.prompts))
        lp = self.score(self.worker, self.prompts, gens)
        for b, (p, g) in enumerate(zip(self.prompts, gens)):
            self.assertEqual((g["tokens"].dtype, g["logprobs"].dtype), (np.int32, np.float32))
            self.assertEqual((len(g["tokens"]), len(g["logprobs"]), g["finish"]), (12, 12, "length"), b)
            self.assertTrue(np.all((g["tokens"] >= 0) & (g["tokens"] < 256)))
            self.assertTrue(np.all(np.isfinite(g["logprobs"])) and np.all(g["logprobs"] < 0))
            np.testing.assert_allclose(g["logprobs"], lp[b, len(p):len(p) + 12], rtol=0, atol=1e-5, err_msg=str(b))
        again = self.worker.generate(self.prompts, 12, temperature=1.0, seed=SEED)
        for g, h in zip(gens, again):
            np.testing.assert_array_equal(g["tokens"], h["tokens"])
            np.testing.assert_array_equal(g["logprobs"], h["logprobs"])
        other = self.worker.generate(self.prompts, 12, temperature=1.0, seed=SEED + 1)
        self.assertTrue(any(not np.array_equal(g["tokens"], h["tokens"]) for g, h in zip(gens, other)))
        # The same prompt twice is two samples (prompt b's randomness is keyed by its index).
        pair = self.worker.generate([self.prompts[1], self.prompts[1]], 12, seed=SEED)
        self.assertFalse(np.array_equal(pair[0]["tokens"], pair[1]["tokens"]))

    def test_greedy_and_stop_tokens(self):
        greedy = self.worker.generate(self.prompts, 6, temperature=0.0)
        lp = self.score(self.worker, self.prompts, greedy)
        for b, (p, g) in enumerate(zip(self.prompts, greedy)):
            np.testing.assert_allclose(g["logprobs"], lp[b, len(p):len(p) + 6], rtol=0, atol=1e-5)
        stop = int(greedy[0]["tokens"][2])
        stopped = self.worker.generate(self.prompts, 6, temperature=0.0, stop_tokens=[stop])
        for g, s in zip(greedy, stopped):
            hits = np.flatnonzero(g["tokens"] == stop)
            end = int(hits[0]) + 1 if len(hits) else 6
            np.testing.assert_array_equal(s["tokens"], g["tokens"][:end])
            self.assertEqual(s["finish"], "stop" if len(hits) else "length")
        self.assertEqual(stopped[0]["finish"], "stop")
        self.assertLessEqual(len(stopped[0]["tokens"]), 3)

    def test_samples_come_from_the_trained_weights(self):
        w = ringtrain.PolicyWorker(base_config(max_total_sequence_length=64,
                                               optimizer={"kwargs": {"lr": 1e-2, "weight_decay": 0.0}}))
        before = w.generate(self.prompts, 8, temperature=0.0)
        ids, lengths = padded_ids(random_rows(self.rng, 4, max_len=30), rng=self.rng)
        self.assertFalse(w.train({"input_ids": ids, "input_lengths": lengths})["skipped"])
        after = w.generate(self.prompts, 8, temperature=0.0)
        lp = self.score(w, self.prompts, after)
        for b, (p, g) in enumerate(zip(self.prompts, after)):
            np.testing.assert_allclose(g["logprobs"], lp[b, len(p):len(p) + 8], rtol=0, atol=1e-5)
        self.assertTrue(any(not np.allclose(x["logprobs"], y["logprobs"], atol=1e-4) for x, y in zip(before, after)))

    def test_every_bad_argument_is_named(self):
        w = self.worker
        cases = [
            (lambda: w.generate([], 4), ValueError, "no prompts"),
            (lambda: w.generate([[1, 2], []], 4), ValueError, r"prompts\[1\] is empty"),
            (lambda: w.generate([[1, 256]], 4), ValueError, r"prompts\[0\]\[1\] = 256 is not in \[0, 256\)"),
            (lambda: w.generate([[1, -1]], 4), ValueError, r"prompts\[0\]\[1\] = -1"),
            (lambda: w.generate([[1, 2**70]], 4), ValueError, r"prompts\[0\]\[1\] = \d+ is not a token id"),
            (lambda: w.generate([[1, 2.5]], 4), TypeError, r"prompts\[0\]\[1\]: expected an integer, got float"),
            (lambda: w.generate([[1, True]], 4), TypeError, r"prompts\[0\]\[1\]: expected an integer, got bool"),
            (lambda: w.generate("12", 4), TypeError, "prompts: expected a list"),
            (lambda: w.generate([1, 2, 3], 2), TypeError, r"prompts\[0\]: expected a sequence of token ids, got int"),
            (lambda: w.generate(7, 2), TypeError, "prompts: expected a list of token-id sequences, got int"),
            (lambda: w.generate([[1]], 2, stop_tokens=5), TypeError, "stop_tokens: expected a sequence of token ids"),
            (lambda: w.generate(None, 4), TypeError, "prompts: expected a list of token-id sequences, got NoneType"),
            (lambda: w.generate([[1]], 4, stop_tokens="7"), TypeError, "stop_tokens: expected a sequence"),
            (lambda: w.generate([[1]], 0), ValueError, "max_new_tokens 0 must be in"),
            (lambda: w.generate([[1]], 64), ValueError, "max_new_tokens 64 must be in"),
            (lambda: w.generate([list(range(60))], 8), ValueError, r"prompts\[0\] has 60 tokens"),
            (lambda: w.generate([[1]], 4.0), TypeError, "max_new_tokens: expected an integer"),
            (lambda: w.generate([[1]], 4, temperature=float("nan")), ValueError, "temperature nan"),
            (lambda: w.generate([[1]], 4, temperature=-1), ValueError, "temperature -1"),
            (lambda: w.generate([[1]], 4, temperature="0.5"), TypeError, "temperature: expected a number, got str"),
            (lambda: w.generate([[1]], 4, top_p=None), TypeError, "top_p: expected a number, got NoneType"),
            (lambda: w.generate([[1]], 4, top_p=True), TypeError, "top_p: expected a number, got bool"),
            (lambda: w.generate([[1]], 4, top_p=0), ValueError, "top_p 0 must be in"),
            (lambda: w.generate([[1]], 4, top_k=-2), ValueError, "top_k -2"),
            (lambda: w.generate([[1]], 4, stop_tokens=[999]), ValueError, r"stop_tokens\[0\] = 999"),
            (lambda: w.generate([[1]], 4, seed=-1), ValueError, "seed: -1"),
            (lambda: w.generate([[1]], 4, seed=2**64), ValueError, "seed: "),
        ]
        for call, error, pattern in cases:
            with self.assertRaisesRegex(error, pattern):
                call()
        self.assertEqual(len(w.generate([[1, 2]], 3)[0]["tokens"]), 3)  # still usable
        # stop_tokens=None is no stop token, as the default () is.
        self.assertEqual(w.generate([[1, 2]], 3, stop_tokens=None, seed=SEED)[0]["tokens"].tolist(),
                         w.generate([[1, 2]], 3, seed=SEED)[0]["tokens"].tolist())
        # NumPy scalars are numbers: the same samples as the Python floats.
        a = w.generate([[1, 2]], 3, temperature=np.float32(0.5), top_p=np.float64(0.9), seed=SEED)
        b = w.generate([[1, 2]], 3, temperature=0.5, top_p=0.9, seed=SEED)
        np.testing.assert_array_equal(a[0]["tokens"], b[0]["tokens"])


class TestCtrlC(unittest.TestCase):
    """Ctrl-C (SIGINT) during a long call of the main thread stops it at its next microbatch or token, on every
    rank of a dp 2 x cp 2 group together, and raises KeyboardInterrupt: the worker stays usable, and an interrupted
    train step changed nothing (the next step is bitwise a fresh worker's first). A SIGINT handler of the user's own
    is left alone: the call completes and the handler runs after it. Each long call is timed uninterrupted first;
    the interrupt comes at 5% of that time and the call must end before half of it (a microbatch is 1/64 of it)."""

    @classmethod
    def setUpClass(cls):
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            raise unittest.SkipTest("the test runner handles SIGINT itself (unittest -c)")
        cls.config = base_config(max_total_sequence_length=512, logprob_batch_size=1, train_micro_batch_size=1,
                                 train_global_batch_size=64)
        cls.config["parallel"] = {"dp": 2, "cp": 2}
        rng = np.random.default_rng(SEED + 47)
        ids, lengths = padded_ids(random_rows(rng, 64, min_len=300, max_len=500), fill=0)
        cls.batch = {"input_ids": ids, "input_lengths": lengths}
        cls.worker = ringtrain.PolicyWorker(cls.config)

    def timed(self, call):
        start = time.monotonic()
        result = call()
        return result, time.monotonic() - start

    def interrupt(self, call, full, at=0.05):
        """call() with a SIGINT at `at` x full seconds: it raises KeyboardInterrupt. Returns how long it ran."""
        timer = threading.Timer(at * full, os.kill, (os.getpid(), signal.SIGINT))
        start = time.monotonic()
        timer.start()
        try:
            with self.assertRaises(KeyboardInterrupt):
                call()
        finally:
            timer.join()
        return time.monotonic() - start

    def interrupt_soon(self, call, full):
        self.assertLess(self.interrupt(call, full), 0.5 * full, "the interrupted call ran on")

    def test_scoring_stops_and_the_worker_scores_on(self):
        w = self.worker
        full_result, full = self.timed(lambda: w.get_logprobs(self.batch)["logprobs"])
        self.interrupt_soon(lambda: w.get_logprobs(self.batch), full)
        np.testing.assert_array_equal(w.get_logprobs(self.batch)["logprobs"], full_result)

    def test_an_interrupted_train_step_changes_nothing(self):
        w = ringtrain.PolicyWorker(self.config)
        before = w.get_logprobs(self.batch)["logprobs"]
        fresh = ringtrain.PolicyWorker(self.config)
        want, full = self.timed(lambda: fresh.train(self.batch))
        self.interrupt_soon(lambda: w.train(self.batch), full)
        self.assertEqual(w.steps_taken, 0)
        np.testing.assert_array_equal(w.get_logprobs(self.batch)["logprobs"], before)
        got = w.train(self.batch)
        self.assertEqual((got["loss"], got["grad_norm"], got["step"]), (want["loss"], want["grad_norm"], 1))

    def test_generation_stops(self):
        w = self.worker
        prompts = [[1, 2, 3]] * 8
        want, full = self.timed(lambda: w.generate(prompts, 500, seed=SEED))
        self.interrupt_soon(lambda: w.generate(prompts, 500, seed=SEED), full)
        again = w.generate(prompts, 500, seed=SEED)
        for a, b in zip(again, want):
            np.testing.assert_array_equal(a["tokens"], b["tokens"])

    def interrupt_while_another_thread_holds(self, w, full, call):
        """call() on the main thread while another thread's scoring holds w (the main thread's call waits for it),
        SIGINT meanwhile: call() raises KeyboardInterrupt, the other call completes. Returns its logprobs."""
        results = []
        other = threading.Thread(target=lambda: results.append(w.get_logprobs(self.batch)["logprobs"]))
        other.start()
        try:
            time.sleep(0.1 * full)
            self.interrupt(call, full, at=0.1)
        finally:
            other.join()
        self.assertEqual(len(results), 1, "the other thread's call was stopped")
        return results[0]

    def test_a_call_of_another_thread_is_not_stopped(self):
        w = self.worker
        want, full = self.timed(lambda: w.get_logprobs(self.batch)["logprobs"])
        np.testing.assert_array_equal(
            self.interrupt_while_another_thread_holds(w, full, lambda: w.get_logprobs(self.batch)), want)
        np.testing.assert_array_equal(w.get_logprobs(self.batch)["logprobs"], want)

    def test_a_ctrl_c_while_train_waits_for_the_worker_stops_it_before_the_step(self):
        w = ringtrain.PolicyWorker(self.config)
        want, full = self.timed(lambda: w.get_logprobs(self.batch)["logprobs"])
        np.testing.assert_array_equal(self.interrupt_while_another_thread_holds(w, full, lambda: w.train(self.batch)),
                                      want)
        self.assertEqual(w.steps_taken, 0)
        np.testing.assert_array_equal(w.get_logprobs(self.batch)["logprobs"], want)

    def test_a_handler_of_the_users_own_runs_after_the_call(self):
        w = self.worker
        want, full = self.timed(lambda: w.get_logprobs(self.batch)["logprobs"])
        calls = []
        previous = signal.signal(signal.SIGINT, lambda signum, frame: calls.append(time.monotonic()))
        try:
            timer = threading.Timer(0.05 * full, os.kill, (os.getpid(), signal.SIGINT))
            start = time.monotonic()
            timer.start()
            got = w.get_logprobs(self.batch)["logprobs"]
            timer.join()
            for _ in range(100):  # the handler runs at the main thread's next bytecodes
                if calls:
                    break
                time.sleep(0.01)
        finally:
            signal.signal(signal.SIGINT, previous)
        np.testing.assert_array_equal(got, want)
        self.assertEqual(len(calls), 1)
        self.assertGreater(calls[0] - start, 0.5 * full, "the handler ran while the call was still running")


class TestExample(unittest.TestCase):
    """examples/python/grpo_loop.py as README shows it, both rollout sources: every step's metrics finite, the data
    file's generation_logprobs those of configs/grpo.yaml's starting policy (noise of 0.02), the sampler's equal to the
    policy's, and the checkpoint and Hugging Face folder written."""

    STEP = re.compile(r"^step (\d+): loss ([-+]\S+)  grad_norm (\S+)  .*\|prev - gen\| (\S+)  (?:reward (\S+)  )?")

    def run_example(self, out, *args):
        r = subprocess.run([sys.executable, os.path.join(SOURCE_DIR, "examples", "python", "grpo_loop.py"),
                            "--steps", "2", "--out", out, *args], capture_output=True, text=True, timeout=300,
                           cwd=SOURCE_DIR, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        steps = [m.groups() for m in map(self.STEP.match, r.stdout.splitlines()) if m]
        self.assertEqual([int(g[0]) for g in steps], [1, 2], r.stdout)
        for g in steps:
            self.assertTrue(all(math.isfinite(float(v)) for v in g[1:4] if v is not None), r.stdout)
        for f in ("config.json", "model.safetensors"):
            self.assertTrue(os.path.isfile(os.path.join(out, "hf", f)), f)
        self.assertTrue(os.path.isdir(os.path.join(out, "step_2")))
        return steps

    def test_file_and_sampler_rollouts(self):
        with tempfile.TemporaryDirectory() as tmp:
            for _, _, _, mismatch, _ in self.run_example(os.path.join(tmp, "file")):
                self.assertLess(float(mismatch), 0.03)  # mean |N(0, 0.02)| = 0.016; a stale file: > 1
            for _, _, _, mismatch, reward in self.run_example(os.path.join(tmp, "sampler"), "--rollouts", "sampler"):
                self.assertEqual(float(mismatch), 0.0)  # the sampler's logprobs are the fp32 policy's (3 decimals)
                self.assertTrue(0 <= float(reward) <= 1)


class TestExitAndFork(unittest.TestCase):
    """The interpreter exiting while daemon threads are inside calls (train, get_logprobs, generate), and a fork while
    another thread is inside one: each in a process of its own, which must end by itself with its own exit code."""

    def run_script(self, script):
        return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                              env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))

    def test_exit_with_daemon_threads_in_calls_is_clean(self):
        # Before: the exit destroyed the C++ statics under the threads' feet (SIGSEGV in 2 of 3 runs) or stopped a
        # thread inside C++ frames (abort).
        script = f"""
import sys, threading, time
import numpy as np
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
import ringtrain
from common import base_config
cfg = base_config(max_total_sequence_length=512, train_global_batch_size=8, train_micro_batch_size=1)
cfg["parallel"] = {{"dp": 2, "cp": 1}}
w = ringtrain.PolicyWorker(cfg)
batch = {{"input_ids": np.ones((8, 400), np.int64)}}
started = threading.Barrier(4)
def loop(call):
    started.wait()
    while True:
        call()
for call in (lambda: w.train(batch), lambda: w.get_logprobs(batch),
             lambda: w.generate([[1, 2, 3]] * 4, 200, seed=1)):
    threading.Thread(target=loop, args=(call,), daemon=True).start()
started.wait()
time.sleep(0.3)
print("exiting", flush=True)
sys.exit(7)
"""
        for attempt in range(3):
            out = self.run_script(script)
            self.assertEqual(out.returncode, 7, f"attempt {attempt}: " + out.stderr[-2000:])
            self.assertIn("exiting", out.stdout)

    def test_a_fork_during_a_call_leaves_that_worker_refusing_in_the_child(self):
        script = f"""
import os, sys, threading, time
import numpy as np
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
import ringtrain
from common import base_config
cfg = base_config(max_total_sequence_length=512, train_global_batch_size=8, train_micro_batch_size=1)
busy, idle = ringtrain.PolicyWorker(cfg), ringtrain.PolicyWorker(cfg)
batch = {{"input_ids": np.ones((8, 400), np.int64)}}
inside = threading.Event()
def loop():
    while True:
        inside.set()
        busy.train(batch)
threading.Thread(target=loop, daemon=True).start()
inside.wait()
time.sleep(0.2)
pid = os.fork()
if pid == 0:
    code = 0
    try:
        busy.get_logprobs({{"input_ids": [[1, 2, 3]]}})
        code = 10
    except ringtrain.Error as e:
        code = 0 if "forked while another thread was in a call" in str(e) else 11
    lp = idle.get_logprobs({{"input_ids": [[1, 2, 3]]}})["logprobs"]
    os._exit(code if lp[0, 1] < 0 else 12)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status), flush=True)
"""
        out = self.run_script(script)
        self.assertEqual(out.returncode, 0, out.stderr[-2000:])
        self.assertIn("child 0", out.stdout)

    def test_values_in_messages_read_back_exactly(self):
        w = ringtrain.PolicyWorker(base_config())
        with self.assertRaisesRegex(ValueError, r"top_p 1.0000001 must be in \(0, 1\]"):
            w.generate([[1, 2]], 4, top_p=1.0000001)
        with self.assertRaisesRegex(ValueError, r"timeout_s = 604800.0000001: expected seconds"):
            ringtrain.PolicyWorker(base_config(), timeout_s=604800.0000001)
        for name, kwargs in (("temperature", {"temperature": 10 ** 400}), ("top_p", {"top_p": 10 ** 400})):
            with self.assertRaisesRegex(ValueError, name + ": 1000.* is too large for a float"):
                w.generate([[1, 2]], 4, **kwargs)


@unittest.skipUnless(__import__("importlib").util.find_spec("torch"), "PyTorch is not installed")
class TestTorch(unittest.TestCase):
    def test_torch_in_torch_out(self):
        import torch

        w = ringtrain.PolicyWorker(base_config())
        ids = torch.randint(0, 256, (3, 10), generator=torch.Generator().manual_seed(SEED))
        want = w.get_logprobs({"input_ids": ids.numpy()})["logprobs"]
        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
        for device in devices:
            out = w.get_logprobs({"input_ids": ids.to(device), "token_mask": torch.ones(3, 10, dtype=torch.bool,
                                                                                         device=device).float()})
            self.assertIsInstance(out["logprobs"], torch.Tensor)
            self.assertEqual((out["logprobs"].dtype, out["logprobs"].device.type), (torch.float32, device))
            np.testing.assert_array_equal(out["logprobs"].cpu().numpy(), want)


if __name__ == "__main__":
    unittest.main()
