"""ringtrain: the policy worker of the ringtrain engine for Python RL loops.

    import ringtrain
    worker = ringtrain.PolicyWorker("configs/grpo.yaml", ["train.seed=3"])
    print(worker.get_logprobs({"input_ids": [[1, 2, 3, 4]]})["logprobs"])

Batches are dicts of [B, S] arrays (NumPy arrays, PyTorch tensors, anything with ``__dlpack__`` or the buffer
protocol, or nested lists), with the keys of the JSONL data rows (src/ringtrain/worker/data.h):

    input_ids            [B, S] integers, required: token ids in [0, vocab) within each row's length
    input_lengths        [B] integers in [1, S]; default S (entries past a row's length are ignored)
    token_mask           [B, S] 0/1 (bool, integer or float): token p is a loss target; default 1
    sample_mask          [B] 0/1: 0 leaves the sequence out of the loss; default 1
    advantages           [B, S] per token, or [B] one per sequence (floating)
    generation_logprobs  [B, S] the sampler's logprobs (floating; entry p scores token p, entry 0 unused)
    prev_logprobs        [B, S] the policy's logprobs before the step (absent: the worker computes them)
    reference_logprobs   [B, S] the reference policy's logprobs (absent: computed when the loss needs them)

Results are [B, S] float32 arrays padded with 0 (position 0 and positions past a row's length are 0): NumPy arrays,
or PyTorch tensors on the device of the inputs when the batch held PyTorch tensors.

CUDA tensors: on a GPU worker, get_logprobs and get_reference_logprobs read a PyTorch CUDA ``input_ids`` (int32 or
int64, any strides) of the worker's GPU in place and write the results into new CUDA tensors there, with no copy to
the host (the token-id check sends one 8-byte verdict back; ``input_lengths`` as a CUDA tensor is copied, B
integers; of the other keys, which scoring does not read, only the names and shapes are checked). The worker's work
runs on CUDA's legacy default stream, ordered after the caller's pending work on those tensors through DLPack's
stream argument, and the call returns when the results are complete. Every other case (train, a CPU worker, other devices or dtypes)
reads the arrays into host memory: a CUDA tensor costs one device-to-host copy on the way in, and results a
host-to-device copy on the way out.

Ranks: with ``device: cpu`` every rank of the dp x cp mesh is a thread of this process (one process runs any
world size; each call runs on all ranks and returns rank 0's results). With ``device: cuda`` each process is one
rank, started by torchrun or ``ringtrain launch`` (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), and
every process calls every method with the same arguments.

Errors: a bad config or a bad batch raises ValueError (TypeError for objects that are not arrays), naming the key;
a failure inside the worker raises ringtrain.Error (a RuntimeError) with the engine's message. The GIL is released
while the worker runs.

Ctrl-C: during get_logprobs, get_reference_logprobs, train or generate on the main thread, Ctrl-C stops the call at
its next microbatch (or token), on every rank together, and raises KeyboardInterrupt; the worker stays usable and a
KeyboardInterrupt out of train means the step changed nothing. A Ctrl-C that comes after a train step's last
microbatch is reported on stderr and the step's result returned. With a SIGINT handler of your own installed, the
call runs to its end and your handler runs after it (after a train step: with the step applied, whatever the
handler raises).

Exit and fork: when the interpreter exits, calls that daemon threads still have under way stop at their next
microbatch (or token) and the exit waits for them; later calls raise ringtrain.Error. A CPU worker can be used in a
forked child, except one that another thread was in a call of when the process forked (its calls raise
ringtrain.Error there: make a new one); a CUDA worker cannot be used across a fork.
"""

import atexit as _atexit
import json as _json
import operator as _operator
import os as _os
import time as _time
import weakref as _weakref
from collections.abc import Iterable as _Iterable, Mapping as _Mapping

from . import _core
from ._core import BatchSchedule, CommError, Error

__all__ = ["PolicyWorker", "BatchSchedule", "Error", "CommError", "load_config"]


def _config_args(config, overrides):
    if overrides is None:
        overrides = []
    elif isinstance(overrides, str):
        raise TypeError("overrides: expected a list of 'key=value' strings, got a str")
    overrides = list(overrides)
    for o in overrides:
        if not isinstance(o, str):
            raise TypeError(f"overrides: expected 'key=value' strings, got {type(o).__name__}")
    # Bytes as a shell passes them: a value that is no UTF-8 (a path, say) reaches the config as its bytes.
    overrides = [_text_bytes(o, "overrides") for o in overrides]
    if isinstance(config, _Mapping):
        # JSON is YAML: the dict goes through the same loader as a file, one key per line for the error positions.
        return _json.dumps(_plain(config, "config", 0), indent=2), True, "<config dict>", overrides
    if isinstance(config, (str, bytes, _os.PathLike)):
        path = _os.fsdecode(config)
        if "\0" in path:
            raise ValueError(f"config: the path {path!r} holds a NUL character")
        if _os.path.isdir(path):
            raise IsADirectoryError(f"config: {path} is a directory; expected a YAML file")
        if not _os.path.isfile(path):
            raise FileNotFoundError(f"config: no such file: {path}")
        return _os.fsencode(path), False, _os.fsencode(path), overrides
    raise TypeError(f"config: expected a YAML path or a dict, got {type(config).__name__}")


_MAX_CONFIG_DEPTH = 64


def _plain(value, where, depth, enclosing=()):
    """A config dict's value as JSON-ready Python (str keys; NumPy and 0-d tensor scalars as Python numbers); anything
    else is a TypeError naming where it sits. `enclosing`: the ids of the dicts and lists around it."""
    if depth > _MAX_CONFIG_DEPTH:
        raise ValueError(f"{where}: nested more than {_MAX_CONFIG_DEPTH} levels deep")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (_Mapping, list, tuple)):
        if id(value) in enclosing:
            raise ValueError(f"{where}: a dict or list inside itself (the config refers back to an enclosing one)")
        enclosing = enclosing + (id(value),)
    if isinstance(value, _Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{where}: keys must be str, got {type(key).__name__} {key!r:.40}")
            out[key] = _plain(item, f"{where}.{key}" if where != "config" else key, depth + 1, enclosing)
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(item, f"{where}[{i}]", depth + 1, enclosing) for i, item in enumerate(value)]
    if getattr(value, "shape", None) == () and hasattr(value, "item"):  # a NumPy scalar or a 0-d array / tensor
        item = value.item()
        if isinstance(item, (bool, int, float)):
            return item
    raise TypeError(f"{where}: expected a number, str, bool, None, list or dict, got {type(value).__name__} "
                    f"{value!r:.40}")


def load_config(config, overrides=None):
    """The resolved run config (every key, defaults filled in) as YAML text; raises ValueError like PolicyWorker."""
    return _core.resolve_config(*_config_args(config, overrides))


def _flag(value, name):
    """value as a bool when it is one (Python's or NumPy's); anything else (a string, a number, None) is a TypeError
    rather than its truth value: with_entropy="no" must not mean True."""
    if isinstance(value, bool):
        return value
    if type(value).__module__ == "numpy" and type(value).__name__ in ("bool_", "bool"):  # NumPy 1 and 2
        return bool(value)
    raise TypeError(f"{name}: expected True or False, got {type(value).__name__} {value!r:.40}")


def _text_bytes(value, name, errors="surrogateescape"):
    """A str as the engine's bytes: UTF-8, with the surrogate escapes of undecodable bytes (os.fsdecode's, and the
    engine's own text) turned back into those bytes; any other lone surrogate (or, with errors="strict", any
    surrogate) is a ValueError naming the argument."""
    try:
        return value.encode("utf-8", errors)
    except UnicodeEncodeError as e:
        raise ValueError(f"{name}: {value!r:.60} holds {value[e.start:e.end]!r}, which is not UTF-8 text") from None


def _path(value, name):
    """A file-system path as bytes (any path Linux allows, UTF-8 or not); a NUL byte, which would end it unseen, is a
    ValueError naming it."""
    try:
        path = _os.fsencode(value)
    except TypeError:
        raise TypeError(f"{name}: expected a path (str, bytes or os.PathLike), got {type(value).__name__}") from None
    if b"\0" in path:
        raise ValueError(f"{name}: the path {path!r:.60} holds a NUL byte")
    return path


def _integer(value, name):
    """value as a Python int when it is an integer (int, NumPy or 0-d tensor integers); a float or a string is a
    TypeError naming it rather than silently truncated."""
    if isinstance(value, bool):
        raise TypeError(f"{name}: expected an integer, got bool")
    try:
        return _operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected an integer, got {type(value).__name__} {value!r:.40}") from None


def _real(value, name):
    """value as a float when it is a real number (int, float, NumPy or 0-d tensor scalars); a string or a bool is a
    TypeError naming it rather than converted."""
    if not isinstance(value, (bool, str, bytes)):
        try:
            return float(value)
        except OverflowError:
            raise ValueError(f"{name}: {value!r:.40} is too large for a float") from None
        except (TypeError, ValueError):
            pass
    raise TypeError(f"{name}: expected a number, got {type(value).__name__} {value!r:.40}")


def _token(value, name):
    """A token id as an int within int64 (the engine checks it against the vocabulary)."""
    v = _integer(value, name)
    if not -2**63 <= v < 2**63:
        raise ValueError(f"{name} = {v} is not a token id")
    return v


def _torch_device(batch):
    """The device of the batch's PyTorch tensors (input_ids' first), or None when it holds none."""
    if not isinstance(batch, _Mapping):
        return None
    values = [batch["input_ids"]] if "input_ids" in batch else []
    values += list(batch.values())
    for v in values:
        if type(v).__module__.split(".")[0] == "torch":
            return v.device
    return None


def _zero_copy(batch, gpu):
    """Whether scoring can read batch's input_ids in place: a 2-D int32 / int64 PyTorch tensor on CUDA device `gpu`."""
    if gpu < 0 or not isinstance(batch, _Mapping) or "input_ids" not in batch:
        return False
    ids = batch["input_ids"]
    if type(ids).__module__.split(".")[0] != "torch":
        return False
    import torch

    return ids.is_cuda and ids.device.index == gpu and ids.dim() == 2 and ids.dtype in (torch.int32, torch.int64)


def _zero_copy_train(batch, gpu):
    """Whether train can read the whole batch in place: input_ids as _zero_copy takes it, and every other array a
    PyTorch CUDA tensor on the same GPU (input_lengths may be anything: it is read as B integers)."""
    if not _zero_copy(batch, gpu):
        return False
    for key, v in batch.items():
        if key in ("input_ids", "input_lengths"):
            continue
        if type(v).__module__.split(".")[0] != "torch" or not v.is_cuda or v.device.index != gpu:
            return False
    return True


def _results(out, device):
    if device is None:
        return out
    import torch  # only when the caller passed PyTorch tensors

    return {k: torch.from_numpy(v).to(device) for k, v in out.items()}


# The workers' C++ objects alive in this process, for the hooks below.
_live_workers = _weakref.WeakSet()


@_atexit.register
def _close_workers_at_exit():
    # A daemon thread may be inside a call (in C++, without the GIL) when the interpreter exits: the interpreter would
    # stop it when it takes the GIL back, in the middle of C++ frames, and the C++ statics it uses are destroyed after
    # this hook. So no worker is made any more, every worker refuses later calls, the calls under way stop at their
    # next microbatch or token, and the hook waits (releasing the GIL) until they have returned to Python.
    _core.begin_exit()
    cores = list(_live_workers)
    for core in cores:
        core.close_at_exit()
    deadline = _time.monotonic() + 120
    while (_core.constructions_in_flight() or any(core.calls_in_flight for core in cores)) and \
            _time.monotonic() < deadline:
        _time.sleep(0.005)


def _after_fork_in_child():
    _core.give_sigint_back_after_fork()
    for core in list(_live_workers):
        core.after_fork_in_child()


if hasattr(_os, "register_at_fork"):
    _os.register_at_fork(after_in_child=_after_fork_in_child)


class PolicyWorker:
    """One policy worker per rank (all of this process's ranks on the CPU), made from a run config.

    config: a YAML path (configs/*.yaml) or a dict with the same structure; overrides: dotted 'key=value' strings
    applied after it (``["policy.train_micro_batch_size=2"]``). Every key is checked (an unknown key is a ValueError
    naming it); the weights are the config's model (a checkpoint folder or builtin:<name>). timeout_s: how long a
    rank waits for the others in a collective.
    """

    def __init__(self, config, overrides=None, *, timeout_s=600.0):
        self._w = _core.PolicyWorker(*_config_args(config, overrides), _real(timeout_s, "timeout_s"))
        _live_workers.add(self._w)

    def get_logprobs(self, batch, with_entropy=False):
        """{'logprobs': [B, S] float32} (and 'entropy' with with_entropy): entry p = log p(token p | tokens < p)."""
        with_entropy = _flag(with_entropy, "with_entropy")
        if _zero_copy(batch, self._w.zero_copy_device):
            return self._w.get_logprobs_cuda(batch, with_entropy)
        return _results(self._w.get_logprobs(batch, with_entropy), _torch_device(batch))

    def get_reference_logprobs(self, batch):
        """{'reference_logprobs': [B, S] float32} under the reference weights (the config's model as loaded)."""
        if _zero_copy(batch, self._w.zero_copy_device):
            return self._w.get_reference_logprobs_cuda(batch)
        return _results(self._w.get_reference_logprobs(batch), _torch_device(batch))

    def train(self, batch):
        """One optimizer step on exactly policy.train_global_batch_size sequences (DPO: pairs as consecutive rows,
        chosen first). Returns a dict: step, loss, grad_norm, lr, valid_tokens, valid_sequences, skipped,
        tokens_per_second, seconds, microbatch_losses (this process's first rank) and metrics (the loss's
        metrics over the whole batch; NaN where the batch counted no token or pair). When every array of the batch is a PyTorch CUDA tensor on this worker's GPU, the
        batch is read in place and the step's per-token values never leave the GPU (masks and token ids are checked
        there: a bad value raises ringtrain.Error naming it)."""
        if _zero_copy_train(batch, self._w.zero_copy_device):
            return self._w.train_cuda(batch)
        return self._w.train(batch)

    def generate(self, prompts, max_new_tokens, *, temperature=1.0, top_p=1.0, top_k=0, stop_tokens=(), seed=0):
        """Continues each prompt (a sequence of token ids) with the built-in sampler (KV cache; on the GPU in bf16
        for a GPU worker) from the current weights: a list with one dict per prompt, 'tokens' (int32, the new tokens,
        a stop token included), 'logprobs' (float32, the policy's logprob of each: the generation_logprobs of the
        loss) and 'finish' ('stop' or 'length'). Prompt b's randomness is keyed by (seed, b): repeat a prompt to draw
        a group of distinct samples; the same seed and prompts give the same samples."""
        if isinstance(prompts, (str, bytes, _Mapping)) or not isinstance(prompts, _Iterable):
            raise TypeError(f"prompts: expected a list of token-id sequences, got {type(prompts).__name__}")
        seqs = []
        for b, p in enumerate(prompts):
            if isinstance(p, (str, bytes, _Mapping)) or not isinstance(p, _Iterable):
                raise TypeError(f"prompts[{b}]: expected a sequence of token ids, got {type(p).__name__}")
            seqs.append([_token(t, f"prompts[{b}][{i}]") for i, t in enumerate(p)])
        seed = _integer(seed, "seed")
        if not 0 <= seed < 2**64:
            raise ValueError(f"seed: {seed} is not in [0, 2**64)")
        if stop_tokens is None:
            stop_tokens = ()
        if isinstance(stop_tokens, (str, bytes, _Mapping)) or not isinstance(stop_tokens, _Iterable):
            raise TypeError(f"stop_tokens: expected a sequence of token ids, got {type(stop_tokens).__name__}")
        stops = [_token(t, f"stop_tokens[{i}]") for i, t in enumerate(stop_tokens)]
        n, k = _integer(max_new_tokens, "max_new_tokens"), _integer(top_k, "top_k")
        for value, name in ((n, "max_new_tokens"), (k, "top_k")):
            if not -2**63 <= value < 2**63:
                raise ValueError(f"{name}: {value} is out of range")
        return self._w.generate(seqs, n, _real(temperature, "temperature"), _real(top_p, "top_p"), k, stops, seed)

    def save(self, path, epoch=0, index=0, rng=""):
        """Writes the training state (weights, optimizer shards, counters, the data position given) to path."""
        position = {}
        for name, value in (("epoch", epoch), ("index", index)):
            position[name] = _integer(value, name)
            if not 0 <= position[name] < 2**63:
                raise ValueError(f"{name} = {position[name]}: expected an integer in [0, 2^63)")
        if not isinstance(rng, str):
            raise TypeError(f"rng: expected a str, got {type(rng).__name__}")
        rng_text = _text_bytes(rng, "rng", "strict")  # kept in JSON, which holds only UTF-8
        self._w.save(_path(path, "path"), position["epoch"], position["index"], rng_text)

    def load(self, path):
        """Restores a state written by save() (the reference weights stay the config's model); returns the data
        position {'epoch', 'index', 'rng'} saved with it."""
        return self._w.load(_path(path, "path"))

    def export_hf(self, path):
        """Writes the current weights as a Hugging Face folder (config.json + model.safetensors)."""
        self._w.export_hf(_path(path, "path"))

    def refit_info(self):
        """The tensors an inference engine receives, in layout order: [{'name', 'shape', 'dtype'}]."""
        return self._w.refit_info()

    @property
    def config(self):
        """The resolved run config as YAML text (every key)."""
        return self._w.config_yaml

    @property
    def model_config(self):
        """The model's config.json as a dict."""
        return _json.loads(self._w.model_config_json)

    @property
    def rank(self):
        """This process's (first) global rank."""
        return self._w.rank

    @property
    def world_size(self):
        """dp x cp ranks in all."""
        return self._w.world_size

    @property
    def local_ranks(self):
        """The ranks this process runs (the whole world on the CPU, one on a GPU)."""
        return self._w.local_ranks

    @property
    def device(self):
        return self._w.device

    @property
    def steps_taken(self):
        """Optimizer steps taken (skipped ones included), restored by load()."""
        return self._w.steps_taken

    def __repr__(self):
        return (f"ringtrain.PolicyWorker(device={self.device}, rank={self.rank}, world_size={self.world_size}, "
                f"steps_taken={self.steps_taken})")
