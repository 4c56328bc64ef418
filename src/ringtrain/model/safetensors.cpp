#include "ringtrain/model/safetensors.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "ringtrain/core/error.h"
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
  throw Error(cat(where, ": unsupported dtype \"", s, "\" (F32, BF16, F16, F64, I32, I64)"));
}

std::string st_dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::F64: return "F64";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
  }
  return "?";
}

StoredTensor parse_entry(const std::string& name, const json& e, const std::string& file, std::string_view data,
                         std::vector<std::pair<uint64_t, uint64_t>>& spans) {
  const std::string where = cat(file, ": tensor '", name, "'");
  RT_CHECK(e.is_object() && e.contains("dtype") && e.contains("shape") && e.contains("data_offsets"), where,
           ": header entry needs dtype, shape and data_offsets, got ", e.dump());
  RT_CHECK(e["dtype"].is_string(), where, ": dtype must be a string, got ", e["dtype"].dump());
  StoredTensor t;
  t.file = file;
  t.dtype = parse_st_dtype(e["dtype"].get<std::string>(), where);
  RT_CHECK(e["shape"].is_array(), where, ": shape must be a list, got ", e["shape"].dump());
  for (const json& d : e["shape"]) {
    RT_CHECK(d.is_number_unsigned(), where, ": shape entries must be non-negative integers, got ", e["shape"].dump());
    t.shape.push_back(d.get<int64_t>());
  }
  const json& off = e["data_offsets"];
  RT_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() && off[1].is_number_unsigned(), where,
           ": data_offsets must be [begin, end], got ", off.dump());
  const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
  RT_CHECK(begin <= end, where, ": data_offsets ", off.dump(), " end before begin");
  RT_CHECK(end <= data.size(), where, ": data_offsets ", off.dump(), " reach past the data section (", data.size(),
           " bytes): the file is truncated or the header is wrong");
  const uint64_t expect = static_cast<uint64_t>(t.numel()) * dtype_size(t.dtype);
  RT_CHECK(end - begin == expect, where, ": ", end - begin, " bytes for shape ", shape_string(t.shape), " ",
           e["dtype"].get<std::string>(), " (expected ", expect, ")");
  t.bytes.assign(data.substr(begin, end - begin));
  spans.emplace_back(begin, end);
  return t;
}

}  // namespace

int64_t StoredTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += cat(i ? ", " : "", shape[i]);
  return s + "]";
}

TensorMap read_safetensors(const std::filesystem::path& path) {
  const std::string file = path.string();
  const std::string bytes = read_file(path);
  RT_CHECK(bytes.size() >= 8, file, ": ", bytes.size(), " bytes is too short for a safetensors file (truncated?)");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<unsigned char>(bytes[i]);
  RT_CHECK(header_len <= kMaxHeaderBytes, file, ": header length ", header_len, " is implausible (not safetensors?)");
  RT_CHECK(8 + header_len <= bytes.size(), file, ": header length ", header_len, " exceeds the file size ",
           bytes.size(), " (truncated?)");
  json header;
  try {
    header = json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<int64_t>(header_len));
  } catch (const json::exception& e) {
    throw Error(cat(file, ": the header is not valid JSON: ", e.what()));
  }
  RT_CHECK(header.is_object(), file, ": the header must be a JSON object");
  const std::string_view data = std::string_view(bytes).substr(8 + header_len);  // no copy of the weights
  TensorMap out;
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    out.emplace(it.key(), parse_entry(it.key(), it.value(), file, data, spans));
  }
  // The tensors must tile the data section without overlaps or gaps (what the format requires).
  std::sort(spans.begin(), spans.end());
  uint64_t pos = 0;
  for (const auto& [b, e] : spans) {
    RT_CHECK(b == pos, file, ": tensor data ", b < pos ? "overlaps" : "has a gap", " at byte ", b,
             " of the data section");
    pos = e;
  }
  RT_CHECK(pos == data.size(), file, ": data section has ", data.size(), " bytes but the tensors cover ", pos,
           " (trailing bytes)");
  return out;
}

TensorMap read_checkpoint_tensors(const std::filesystem::path& dir) {
  const std::filesystem::path index = dir / "model.safetensors.index.json";
  if (!std::filesystem::exists(index)) {
    const std::filesystem::path single = dir / "model.safetensors";
    RT_CHECK(std::filesystem::exists(single), dir.string(), ": no model.safetensors or model.safetensors.index.json");
    return read_safetensors(single);
  }
  json j;
  try {
    j = json::parse(read_file(index));
  } catch (const json::exception& e) {
    throw Error(cat(index.string(), ": invalid JSON: ", e.what()));
  }
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
    for (auto& [name, t] : read_safetensors(dir / shard)) {
      RT_CHECK(!all.count(name), index.string(), ": tensor '", name, "' appears in two shards");
      all.emplace(name, std::move(t));
    }
  }
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    auto found = all.find(it.key());
    RT_CHECK(found != all.end(), index.string(), ": tensor '", it.key(), "' is listed for ", it.value().dump(),
             " but that file does not hold it");
    RT_CHECK(found->second.file == (dir / it.value().get<std::string>()).string(), index.string(), ": tensor '",
             it.key(), "' is listed for ", it.value().dump(), " but found in ", found->second.file);
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
  std::string out;
  out.reserve(8 + h.size() + pos);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((static_cast<uint64_t>(h.size()) >> (8 * i)) & 0xff));
  out += h;
  for (const auto& [name, t] : tensors) out += t.bytes;
  write_file_atomic(path, out);
}

std::vector<float> to_float32(const std::string& name, const StoredTensor& t) {
  RT_CHECK(is_float(t.dtype), t.file, ": tensor '", name, "' has dtype ", dtype_name(t.dtype),
           ", expected a float type");
  const int64_t n = t.numel();
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(load_as_double(t.bytes.data(), t.dtype, i));
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
