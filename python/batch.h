// Batches between Python and the worker: a dict of [B, S] arrays (NumPy, PyTorch, anything with __dlpack__ or the
// buffer protocol, or nested lists) becomes worker::Samples, checked key by key (errors name the key, the sample
// and the position), and per-sequence results become [B, S] float32 NumPy arrays padded with 0.
//
// Keys (data.h's JSONL fields, padded to S columns):
//   input_ids            [B, S] integers, required; token ids in [0, vocab) within each row's length
//   input_lengths        [B] integers in [1, S]; default S for every row (entries past a row's length are ignored)
//   token_mask           [B, S] 0/1 (bool, integer or float): token p is a loss target; default 1
//   sample_mask          [B] 0/1: 0 leaves the sequence out of the loss; default 1
//   advantages           [B, S] per token, or [B] one number per sequence (floating)
//   generation_logprobs, prev_logprobs, reference_logprobs   [B, S] floating, entry 0 unused
// CUDA tensors are copied to host memory by read_batch (worker::Samples are host vectors); read_rows_batch leaves a
// CUDA input_ids where it is (get_logprobs and get_reference_logprobs on a GPU worker: the zero-copy path).
// Sizes are checked before anything of the batch's size is allocated: S beyond policy.max_total_sequence_length
// (without input_lengths) and B x S beyond kMaxBatchElements are errors naming input_ids.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "ringtrain/worker/config.h"
#include "ringtrain/worker/data.h"
#include "ringtrain/worker/policy_worker.h"

namespace ringtrain::python {

namespace py = pybind11;

// One array as the module found it: read in place, element by element, never copied whole (a broadcast view of
// 2^40 elements costs nothing until the checks of read_batch have refused it). A CUDA tensor's storage is copied to
// host memory (only the bytes its strides reach). Holds the source alive; needs the GIL, also to be destroyed.
struct HostArray {
  std::string key;
  std::string dtype;  // "int64", "float32", "bool", ...
  bool integer = false, floating = false, boolean = false;
  std::vector<int64_t> shape;

  // Element i in C order widened to double: exact for every value a batch key accepts (integers up to 2^53).
  double at(int64_t i) const;
  // Element i as written (an integer in full, a uint64 above 2^63 included), for messages.
  std::string text(int64_t i) const;

  const char* base = nullptr;
  std::vector<int64_t> byte_strides;
  int elem = 0;  // batch.cpp's element type
  std::shared_ptr<const void> owner;
};

// Reads any array-like object; errors (ValueError / TypeError) name `key`. Needs the GIL.
HostArray read_array(py::handle obj, const std::string& key);

// The most elements ([B, S]) of one batch: its results alone are B x S float32.
constexpr int64_t kMaxBatchElements = int64_t{1} << 32;

// A CUDA tensor read in place: its view and what keeps it alive (the DLPack capsule's tensor). Needs the GIL, also to
// be destroyed.
struct DeviceArray {
  TensorView view;
  std::shared_ptr<const void> owner;
};
// A CUDA tensor of shape [B, S] or [B], any strides, of bool / uint8 (as U8), int32, int64, float16, bfloat16, float32
// or float64; a TypeError / ValueError naming `key`.
DeviceArray read_device_array(py::handle obj, const std::string& key);

// The batch of a scoring call on CUDA input_ids: ids read in place, lengths from input_lengths (host values; a CUDA
// input_lengths is copied, B integers), checked as read_batch checks them (the token ids on the device, one 8-byte
// verdict back). Of the other keys only the names and shapes are checked (a CUDA tensor's from its DLPack header):
// scoring does not read their values.
struct RowsBatch {
  DeviceArray ids;
  worker::TokenRowsBatch rows;
};
RowsBatch read_rows_batch(py::handle batch, const worker::Config& config, int64_t vocab, const std::string& what);

struct Batch {
  std::vector<worker::Sample> samples;
  int64_t columns = 0;  // S of the caller's arrays: the width of the results
};

// The samples of a batch dict, checked against the model's vocabulary and policy.max_total_sequence_length.
// `what` names the call in errors ("get_logprobs: batch['input_ids']: ..."). Raises ValueError / TypeError.
Batch read_batch(py::handle batch, const worker::Config& config, int64_t vocab, const std::string& what);

// What train() checks before the ranks start: the batch size and the fields the configured loss needs.
void check_train_batch(const Batch& batch, const worker::Config& config);
void check_train_fields(int64_t sequences, bool has_advantages, bool has_generation_logprobs,
                        const worker::Config& config);

// The batch of a train call on CUDA tensors, every key read in place: input_ids and input_lengths as
// read_rows_batch reads them; the other keys CUDA tensors on input_ids' GPU (masks of any dtype, holding 0/1, the
// rest floating), their shapes checked here and their values on the device by the trainer.
struct TrainRowsInput {
  RowsBatch ids;
  std::vector<DeviceArray> held;
  worker::TrainRowsBatch rows;
};
TrainRowsInput read_train_rows_batch(py::handle batch, const worker::Config& config, int64_t vocab);

// [B, columns] float32, row b = values[b] then zeros.
py::array_t<float> padded(const std::vector<std::vector<float>>& values, int64_t columns);

}  // namespace ringtrain::python
