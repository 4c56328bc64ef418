#include "ringtrain/model/safetensors.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <set>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "ringtrain/core/checked.h"
#include "ringtrain/core/error.h"
#include "ringtrain/core/json.h"
#include "ringtrain/model/file_io.h"

namespace ringtrain::model {
namespace {

using nlohmann::json;

// Header lengths above this are not checkpoints (the format's own reader caps it at 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

DType parse_st_dtype(const std::string& s, const std::string& where) {
  if (s == "F32") return DType::F32;
  if (s == "BF16") return DType::BF16;
  if (s == "F16") return DType::F16;
  if (s == "F64") return DType::F64;
  if (s == "I32") return DType::I32;
  if (s == "I64") return DType::I64;
  if (s == "U8") return DType::U8;
  throw Error(cat(where, ": unsupported dtype \"", s, "\" (F32, BF16, F16, F64, I32, I64, U8)"));
}

std::string st_dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::F64: return "F64";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U8: return "U8";
  }
  return "?";
}

StoredTensor parse_entry(const std::string& name, const json& e, const std::string& file, uint64_t data_start,
                         uint64_t data_size, std::vector<std::pair<uint64_t, uint64_t>>& spans) {
  const std::string where = cat(file, ": tensor '", name, "'");
  RT_CHECK(e.is_object() && e.contains("dtype") && e.contains("shape") && e.contains("data_offsets"), where,
           ": header entry needs dtype, shape and data_offsets, got ", json_excerpt(e));
  RT_CHECK(e["dtype"].is_string(), where, ": dtype must be a string, got ", json_excerpt(e["dtype"]));
  StoredTensor t;
  t.file = file;
  t.dtype = parse_st_dtype(e["dtype"].get<std::string>(), where);
  RT_CHECK(e["shape"].is_array() && e["shape"].size() <= 8, where, ": shape must be a list of at most 8 sizes, got ",
           json_excerpt(e["shape"]));
  for (const json& d : e["shape"]) {
    RT_CHECK(d.is_number_unsigned() && d.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX), where,
             ": shape entries must be non-negative integers, got ", json_excerpt(e["shape"]));
    t.shape.push_back(d.get<int64_t>());
  }
  const json& off = e["data_offsets"];
  RT_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() && off[1].is_number_unsigned(), where,
           ": data_offsets must be [begin, end], got ", json_excerpt(off));
  const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
  RT_CHECK(begin <= end, where, ": data_offsets ", off.dump(), " end before begin");
  RT_CHECK(end <= data_size, where, ": data_offsets ", off.dump(), " reach past the data section (", data_size,
           " bytes): the file is truncated or the header is wrong");
  const int64_t expect = checked_mul(checked_numel(t.shape, cat(where, ": shape ", shape_string(t.shape))),
                                     static_cast<int64_t>(dtype_size(t.dtype)), cat(where, ": byte size"));
  RT_CHECK(end - begin == static_cast<uint64_t>(expect), where, ": ", end - begin, " bytes for shape ",
           shape_string(t.shape), " ", e["dtype"].get<std::string>(), " (expected ", expect, ")");
  t.file_offset = data_start + begin;
  spans.emplace_back(begin, end);
  return t;
}

// Converts `n` elements of `dtype` at `src` into fp32.
void convert_to_float32(const char* src, DType dtype, int64_t n, float* dst) {
  if (dtype == DType::F32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(load_as_double(src, dtype, i));
}

}  // namespace

int64_t StoredTensor::numel() const { return checked_numel(shape, cat(file, ": shape ", shape_string(shape))); }

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += cat(i ? ", " : "", shape[i]);
  return s + "]";
}

TensorMap read_safetensors(const std::filesystem::path& path, TensorData data) {
  const InputFile in(path);
  const std::string& file = in.path();
  const uint64_t size = in.size();
  RT_CHECK(size >= 8, file, ": ", size, " bytes is too short for a safetensors file (truncated?)");
  unsigned char len_bytes[8];
  in.read_at(0, len_bytes, 8);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  RT_CHECK(header_len <= kMaxHeaderBytes, file, ": header length ", header_len, " is implausible (not safetensors?)");
  RT_CHECK(8 + header_len <= size, file, ": header length ", header_len, " exceeds the file size ", size,
           " (truncated?)");
  std::string header_text(header_len, '\0');
  in.read_at(8, header_text.data(), header_len);
  const json header = parse_json(header_text, cat(file, ": header"));
  RT_CHECK(header.is_object(), file, ": the header must be a JSON object");
  const uint64_t data_start = 8 + header_len, data_size = size - data_start;
  TensorMap out;
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    StoredTensor& t = out.emplace(it.key(), parse_entry(it.key(), it.value(), file, data_start, data_size, spans))
                          .first->second;
    t.source = in.identity();
  }
  // The tensors must tile the data section without overlaps or gaps (what the format requires).
  std::sort(spans.begin(), spans.end());
  uint64_t pos = 0;
  for (const auto& [b, e] : spans) {
    RT_CHECK(b == pos, file, ": tensor data ", b < pos ? "overlaps" : "has a gap", " at byte ", b,
             " of the data section");
    pos = e;
  }
  RT_CHECK(pos == data_size, file, ": data section has ", data_size, " bytes but the tensors cover ", pos,
           " (trailing bytes)");
  if (data == TensorData::Load) {
    for (auto& [name, t] : out) {
      t.bytes.resize(static_cast<size_t>(t.numel()) * dtype_size(t.dtype));
      in.read_at(t.file_offset, t.bytes.data(), t.bytes.size());
    }
  }
  return out;
}

TensorMap read_checkpoint_tensors(const std::filesystem::path& dir, TensorData data) {
  // model.safetensors first, as transformers looks for it before an index.
  const std::filesystem::path single = dir / "model.safetensors", index = dir / "model.safetensors.index.json";
  if (std::filesystem::exists(single)) return read_safetensors(single, data);
  RT_CHECK(std::filesystem::exists(index), dir.string(), ": no model.safetensors or model.safetensors.index.json");
  const json j = parse_json(read_file(index), index.string());
  RT_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), index.string(),
           ": expected an object with a 'weight_map' object");
  std::set<std::string> shards;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    RT_CHECK(it.value().is_string(), index.string(), ": weight_map['", it.key(), "'] must be a file name");
    shards.insert(it.value().get<std::string>());
  }
  TensorMap all;
  for (const std::string& shard : shards) {
    RT_CHECK(shard.find('/') == std::string::npos, index.string(), ": shard name '", shard, "' must be a plain file name");
    for (auto& [name, t] : read_safetensors(dir / shard, data)) {
      RT_CHECK(!all.count(name), index.string(), ": tensor '", name, "' appears in two shards");
      all.emplace(name, std::move(t));
    }
  }
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    auto found = all.find(it.key());
    RT_CHECK(found != all.end(), index.string(), ": tensor '", it.key(), "' is listed for ", json_excerpt(it.value()),
             " but that file does not hold it");
    RT_CHECK(found->second.file == (dir / it.value().get<std::string>()).string(), index.string(), ": tensor '",
             it.key(), "' is listed for ", json_excerpt(it.value()), " but found in ", found->second.file);
  }
  return all;
}

void write_safetensors(const std::filesystem::path& path, const TensorMap& tensors) {
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}};  // transformers refuses files without a known format tag
  uint64_t pos = 0;
  for (const auto& [name, t] : tensors) {
    RT_CHECK(t.bytes.size() == static_cast<size_t>(t.numel()) * dtype_size(t.dtype), "write ", path.string(),
             ": tensor '", name, "' has ", t.bytes.size(), " bytes for shape ", shape_string(t.shape));
    header[name] = {{"dtype", st_dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {pos, pos + t.bytes.size()}}};
    pos += t.bytes.size();
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // keeps the data section 8-byte aligned
  std::string len(8, '\0');
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((static_cast<uint64_t>(h.size()) >> (8 * i)) & 0xff);
  write_file_atomic(path, [&](const ByteSink& sink) {
    sink(len);
    sink(h);
    for (const auto& [name, t] : tensors) sink(t.bytes);
  });
}

void to_float32(const std::string& name, const StoredTensor& t, float* dst) {
  RT_CHECK(is_float(t.dtype), t.file, ": tensor '", name, "' has dtype ", dtype_name(t.dtype),
           ", expected a float type");
  const int64_t n = t.numel();
  const size_t elem = dtype_size(t.dtype);
  if (t.bytes.size() == static_cast<size_t>(n) * elem) {
    convert_to_float32(t.bytes.data(), t.dtype, n, dst);
    return;
  }
  RT_CHECK(t.bytes.empty() && t.file_offset >= 0, t.file, ": tensor '", name, "' holds ", t.bytes.size(),
           " bytes for shape ", shape_string(t.shape));
  // Straight from the file into the destination, a bounded chunk at a time.
  const InputFile in(t.file);
  RT_CHECK(in.identity() == t.source, t.file, ": the file changed after its header was read (replaced or rewritten; ",
           "tensor '", name, "'): load the checkpoint again");
  constexpr int64_t kChunkElems = int64_t{1} << 20;
  std::string chunk(static_cast<size_t>(std::min(n, kChunkElems)) * elem, '\0');
  for (int64_t i = 0; i < n; i += kChunkElems) {
    const int64_t m = std::min(kChunkElems, n - i);
    in.read_at(static_cast<uint64_t>(t.file_offset) + static_cast<uint64_t>(i) * elem, chunk.data(),
               static_cast<size_t>(m) * elem);
    convert_to_float32(chunk.data(), t.dtype, m, dst + i);
  }
}

std::vector<float> to_float32(const std::string& name, const StoredTensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  to_float32(name, t, out.data());
  return out;
}

StoredTensor from_float32(const std::vector<float>& values, std::vector<int64_t> shape, DType dtype) {
  StoredTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  RT_CHECK(static_cast<int64_t>(values.size()) == t.numel(), "from_float32: ", values.size(), " values for shape ",
           shape_string(t.shape));
  t.bytes.resize(values.size() * dtype_size(dtype));
  for (size_t i = 0; i < values.size(); ++i) store_from_double(t.bytes.data(), dtype, static_cast<int64_t>(i), values[i]);
  return t;
}

}  // namespace ringtrain::model
