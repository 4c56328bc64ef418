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

namespace ringtrain::model {

struct StoredTensor {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::string bytes;  // little-endian elements
  std::string file;   // where it was read from (for errors)
  int64_t numel() const;
};
using TensorMap = std::map<std::string, StoredTensor>;

// Reads one file; errors name the file and what is wrong (truncation, bad header, bad offsets, dtype).
TensorMap read_safetensors(const std::filesystem::path& file);
// Reads a checkpoint folder: the index and its shards when present, else model.safetensors.
TensorMap read_checkpoint_tensors(const std::filesystem::path& dir);
// Writes one file (temporary name, then rename), tensors laid out in name order.
void write_safetensors(const std::filesystem::path& file, const TensorMap& tensors);

// Converts a stored float tensor to fp32 / fp64; an error names the tensor when its dtype is not a float.
std::vector<float> to_float32(const std::string& name, const StoredTensor& t);
// Builds a stored tensor of `dtype` from fp32 values (rounded to nearest even for bf16/fp16).
StoredTensor from_float32(const std::vector<float>& values, std::vector<int64_t> shape, DType dtype);

std::string shape_string(const std::vector<int64_t>& shape);  // "[64, 256]"

}  // namespace ringtrain::model
