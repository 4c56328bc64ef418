// The safetensors format: 8-byte little-endian header length N, N bytes of JSON
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the data (offsets are
// relative to the end of the header). Checkpoints are one `model.safetensors` or shards listed by
// `model.safetensors.index.json` ({"weight_map": {name: file}}).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "ringtrain/core/dtype.h"
#include "ringtrain/model/file_io.h"

namespace ringtrain::model {

struct StoredTensor {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::string bytes;        // little-endian elements; empty when read with TensorData::Defer
  std::string file;         // where it was read from (for errors, and the deferred data)
  int64_t file_offset = -1;  // where its data starts in `file`
  FileIdentity source;       // `file` as its header was read: the deferred data must come from the same version
  int64_t numel() const;     // an error when the product overflows
};
using TensorMap = std::map<std::string, StoredTensor>;

// Load: each tensor's bytes are read into `bytes`. Defer: only the validated header; the data stays in the
// file until to_float32 reads it into its destination (no copy of the whole checkpoint in memory).
enum class TensorData : uint8_t { Load, Defer };

// Reads one file; errors name the file and what is wrong (truncation, bad header, bad offsets, dtype).
TensorMap read_safetensors(const std::filesystem::path& file, TensorData data = TensorData::Load);
// Reads a checkpoint folder: the index and its shards when present, else model.safetensors.
TensorMap read_checkpoint_tensors(const std::filesystem::path& dir, TensorData data = TensorData::Load);
// Writes one file (temporary name, then rename), tensors laid out in name order.
void write_safetensors(const std::filesystem::path& file, const TensorMap& tensors);

// Converts a stored float tensor to fp32 (from its bytes, or from its file when deferred) into numel() floats at
// `dst`; an error names the tensor when its dtype is not a float.
void to_float32(const std::string& name, const StoredTensor& t, float* dst);
std::vector<float> to_float32(const std::string& name, const StoredTensor& t);
// Builds a stored tensor of `dtype` from fp32 values (rounded to nearest even for bf16/fp16).
StoredTensor from_float32(const std::vector<float>& values, std::vector<int64_t> shape, DType dtype);

std::string shape_string(const std::vector<int64_t>& shape);  // "[64, 256]"

}  // namespace ringtrain::model
