#include "ringtrain/worker/data.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include <nlohmann/json.hpp>

#include "ringtrain/core/error.h"
#include "ringtrain/core/json.h"
#include "ringtrain/core/hashed_normal.h"
#include "ringtrain/model/file_io.h"
#include "ringtrain/model/safetensors.h"

namespace ringtrain::worker {
namespace {

using json = nlohmann::ordered_json;

// A row is an object of lists of numbers.
constexpr int kMaxRowDepth = 2;

std::string short_dump(const json& v) {
  std::string s = v.dump();
  return s.size() <= 40 ? s : s.substr(0, 40) + "...";
}

// One row's reader: errors name "SOURCE:LINE: field[index]".
struct RowReader {
  const json& row;
  std::string where;
  const DataSpec& spec;

  const json& array(const std::string& key) const {
    const json& v = row.at(key);
    RT_CHECK(v.is_array(), where, ": ", key, ": expected a list, got ", short_dump(v));
    return v;
  }

  std::vector<int32_t> tokens(const std::string& key) const {
    const json& a = array(key);
    const int64_t n = static_cast<int64_t>(a.size());
    RT_CHECK(n >= 1 && n <= spec.max_length, where, ": ", key, ": ", n,
             " tokens (expected 1 to ", spec.max_length_key, " = ", spec.max_length, ")");
    std::vector<int32_t> out(a.size());
    for (size_t i = 0; i < a.size(); ++i) {
      const json& t = a[i];
      const bool id = (t.is_number_integer() && t.get<int64_t>() >= 0 && t.get<int64_t>() < spec.vocab);
      RT_CHECK(id, where, ": ", key, "[", i, "] = ", short_dump(t), ": not a token id in [0, ", spec.vocab, ")");
      out[i] = static_cast<int32_t>(t.get<int64_t>());
    }
    return out;
  }

  float zero_one(const json& v, const std::string& name) const {
    if (v.is_boolean()) return v.get<bool>() ? 1.0f : 0.0f;
    RT_CHECK(v.is_number() && (v.get<double>() == 0.0 || v.get<double>() == 1.0), where, ": ", name, " = ",
             short_dump(v), ": expected 0 or 1");
    return static_cast<float>(v.get<double>());
  }

  float finite(const json& v, const std::string& name) const {
    RT_CHECK(v.is_number(), where, ": ", name, " = ", short_dump(v), ": expected a number");
    const double d = v.get<double>();
    RT_CHECK(std::isfinite(d) && std::abs(d) <= std::numeric_limits<float>::max(), where, ": ", name, " = ", short_dump(v),
             ": not a finite float32");
    return static_cast<float>(d);
  }

  std::vector<float> mask(const std::string& key, size_t length) const {
    if (!row.contains(key)) return std::vector<float>(length, 1.0f);
    const json& a = array(key);
    RT_CHECK(a.size() == length, where, ": ", key, " has ", a.size(), " entries, the sequence ", length);
    std::vector<float> out(length);
    for (size_t i = 0; i < length; ++i) out[i] = zero_one(a[i], cat(key, "[", i, "]"));
    return out;
  }

  // Per-token log-probabilities (generation, previous, reference): finite and at most 0.
  std::vector<float> logprobs(const std::string& key, size_t length) const {
    std::vector<float> out = per_token(key, length, false);
    for (size_t i = 0; i < out.size(); ++i)
      RT_CHECK(out[i] <= 0.0f, where, ": ", key, "[", i, "] = ", short_dump(row.at(key)[i]),
               ": a log-probability is at most 0");
    return out;
  }

  // Per-token values; a single number is spread over every token when `scalar_ok`.
  std::vector<float> per_token(const std::string& key, size_t length, bool scalar_ok) const {
    if (!row.contains(key)) return {};
    const json& v = row.at(key);
    if (scalar_ok && v.is_number()) return std::vector<float>(length, finite(v, key));
    const json& a = array(key);
    RT_CHECK(a.size() == length, where, ": ", key, " has ", a.size(), " entries, the sequence ", length);
    std::vector<float> out(length);
    for (size_t i = 0; i < length; ++i) out[i] = finite(a[i], cat(key, "[", i, "]"));
    return out;
  }
};

const std::vector<std::string> kSampleKeys = {"input_ids",           "token_mask",    "sample_mask",       "advantages",
                                              "generation_logprobs", "prev_logprobs", "reference_logprobs"};
const std::vector<std::string> kPairKeys = {"chosen_input_ids",          "rejected_input_ids",
                                            "chosen_token_mask",         "rejected_token_mask",
                                            "chosen_reference_logprobs", "rejected_reference_logprobs"};

std::string key_list(const std::vector<std::string>& keys) {
  std::string s;
  for (const std::string& k : keys) s += (s.empty() ? "" : ", ") + k;
  return s;
}

void check_keys(const json& row, const std::vector<std::string>& known, const std::string& where) {
  RT_CHECK(row.is_object(), where, ": expected a JSON object, got ", short_dump(row));
  for (const auto& [key, value] : row.items()) {
    RT_CHECK(std::find(known.begin(), known.end(), key) != known.end(), where, ": unknown field '", key.substr(0, 40),
             "' (expected ", key_list(known), ")");
  }
}

Sample read_sample(const RowReader& r) {
  Sample s;
  RT_CHECK(r.row.contains("input_ids"), r.where, ": missing input_ids");
  s.input_ids = r.tokens("input_ids");
  const size_t n = s.input_ids.size();
  s.token_mask = r.mask("token_mask", n);
  if (r.row.contains("sample_mask")) s.sample_mask = r.zero_one(r.row.at("sample_mask"), "sample_mask");
  s.advantages = r.per_token("advantages", n, true);
  s.generation_logprobs = r.logprobs("generation_logprobs", n);
  s.prev_logprobs = r.logprobs("prev_logprobs", n);
  s.reference_logprobs = r.logprobs("reference_logprobs", n);
  return s;
}

Sample read_side(const RowReader& r, const std::string& side) {
  Sample s;
  RT_CHECK(r.row.contains(side + "_input_ids"), r.where, ": missing ", side, "_input_ids");
  s.input_ids = r.tokens(side + "_input_ids");
  s.token_mask = r.mask(side + "_token_mask", s.input_ids.size());
  s.reference_logprobs = r.logprobs(side + "_reference_logprobs", s.input_ids.size());
  return s;
}

// Which optional per-token fields a sample has: the first row sets the pattern every other row must follow.
std::vector<std::pair<std::string, bool>> optional_fields(const Sample& s) {
  return {{"advantages", !s.advantages.empty()},
          {"generation_logprobs", !s.generation_logprobs.empty()},
          {"prev_logprobs", !s.prev_logprobs.empty()},
          {"reference_logprobs", !s.reference_logprobs.empty()}};
}

void check_requirements(const Sample& s, const DataSpec& spec, const std::string& where) {
  RT_CHECK(!spec.need_advantages || !s.advantages.empty(), where, ": advantages are required by loss_fn.type ",
           loss_type_name(spec.loss));
  RT_CHECK(!spec.need_generation_logprobs || !s.generation_logprobs.empty(), where,
           ": generation_logprobs are required by loss_fn.use_importance_sampling_correction");
}

void check_consistent(const Dataset& d, const Sample& s, const std::string& where, const std::string& first) {
  if (d.samples.empty()) return;
  const auto want = optional_fields(d.samples[0]);
  const auto have = optional_fields(s);
  for (size_t i = 0; i < want.size(); ++i) {
    RT_CHECK(want[i].second == have[i].second, where, ": ", want[i].first, want[i].second ? " missing" : " present",
             " (", first, want[i].second ? " has it" : " does not", "; every row must agree)");
  }
}

// The token masks, which default to ones when left out, must be given in every row or in none: a row without the
// token_mask the others have would otherwise put its prompt into the loss unseen. (sample_mask, one flag a row, may be
// given where it is 0 only.)
void check_masks_given_alike(const json& row, const std::vector<std::string>& masks, std::vector<bool>& first_row,
                             const std::string& where, const std::string& first) {
  const bool is_first = first_row.empty();
  for (size_t i = 0; i < masks.size(); ++i) {
    const bool has = row.contains(masks[i]);
    if (is_first) first_row.push_back(has);
    else
      RT_CHECK(has == first_row[i], where, ": ", masks[i], has ? " present" : " missing", " (", first,
               has ? " does not" : " has it", "; every row must agree)");
  }
}

}  // namespace

DataSpec data_spec(const Config& c, const model::ModelConfig& m) {
  DataSpec s;
  s.vocab = m.vocab;
  s.max_length = c.policy.max_total_sequence_length;
  s.loss = c.loss_fn.type;
  s.need_advantages = c.loss_fn.type == LossType::ClippedPg;
  s.need_generation_logprobs = c.loss_fn.type == LossType::ClippedPg && c.loss_fn.use_importance_sampling_correction;
  return s;
}

int64_t Dataset::tokens() const {
  int64_t n = 0;
  for (const Sample& s : samples) n += s.length();
  return n;
}

Dataset parse_jsonl(std::string_view text, const std::string& source, const DataSpec& spec) {
  RT_CHECK(spec.vocab > 0 && spec.max_length > 0, source, ": data spec without vocab or max length");
  Dataset d;
  d.pairs = spec.loss == LossType::Dpo;
  const std::string first = cat(source, ":1");
  const std::vector<std::string> masks =
      d.pairs ? std::vector<std::string>{"chosen_token_mask", "rejected_token_mask"} : std::vector<std::string>{"token_mask"};
  std::vector<bool> first_row_masks;
  int64_t lineno = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    const std::string where = cat(source, ":", lineno);
    RT_CHECK(line.find_first_not_of(" \t") != std::string_view::npos, where, ": blank line (one JSON object per line)");
    const json row = parse_ordered_json(line, where, kMaxRowDepth);
    const RowReader r{row, where, spec};
    if (d.pairs) {
      check_keys(row, kPairKeys, where);
      for (const char* side : {"chosen", "rejected"}) {
        Sample s = read_side(r, side);
        check_consistent(d, s, cat(where, ": ", side), first);
        d.samples.push_back(std::move(s));
      }
      check_masks_given_alike(row, masks, first_row_masks, where, first);
    } else {
      check_keys(row, kSampleKeys, where);
      Sample s = read_sample(r);
      check_requirements(s, spec, where);
      check_consistent(d, s, where, first);
      check_masks_given_alike(row, masks, first_row_masks, where, first);
      d.samples.push_back(std::move(s));
    }
  }
  RT_CHECK(!d.samples.empty(), source, ": no samples");
  return d;
}

namespace {

constexpr const char* kFloatFields[] = {"token_mask", "advantages", "generation_logprobs", "prev_logprobs",
                                        "reference_logprobs"};

// Sample or const Sample.
template <typename S>
auto& float_field(S& s, std::string_view name) {
  if (name == "token_mask") return s.token_mask;
  if (name == "advantages") return s.advantages;
  if (name == "generation_logprobs") return s.generation_logprobs;
  if (name == "prev_logprobs") return s.prev_logprobs;
  return s.reference_logprobs;
}

Dataset read_batch_safetensors(const std::filesystem::path& file, const DataSpec& spec) {
  const std::string src = file.string();
  const model::TensorMap t = model::read_safetensors(file);
  for (const auto& [name, tensor] : t) {
    const bool known = name == "input_ids" || name == "lengths" || name == "sample_mask" ||
                       std::find(std::begin(kFloatFields), std::end(kFloatFields), name) != std::end(kFloatFields);
    RT_CHECK(known, src, ": unknown tensor '", name.substr(0, 40), "'");
  }
  auto get = [&](const std::string& name) -> const model::StoredTensor& {
    auto it = t.find(name);
    RT_CHECK(it != t.end(), src, ": missing tensor '", name, "'");
    return it->second;
  };
  const model::StoredTensor& ids = get("input_ids");
  RT_CHECK(ids.dtype == DType::I32 && ids.shape.size() == 2, src, ": input_ids must be I32 [B, S], got ",
           dtype_name(ids.dtype), " ", model::shape_string(ids.shape));
  const int64_t B = ids.shape[0], S = ids.shape[1];
  int64_t cells = 0;
  RT_CHECK(!__builtin_mul_overflow(B, S, &cells) && static_cast<uint64_t>(cells) * 4 == ids.bytes.size(), src,
           ": input_ids shape ", model::shape_string(ids.shape), " does not match its ", ids.bytes.size(), " bytes");
  const model::StoredTensor& lens = get("lengths");
  RT_CHECK((lens.dtype == DType::I32 || lens.dtype == DType::I64) && lens.shape == std::vector<int64_t>{B}, src,
           ": lengths must be I32 or I64 [", B, "], got ", dtype_name(lens.dtype), " ",
           model::shape_string(lens.shape));
  Dataset d;
  d.pairs = spec.loss == LossType::Dpo;
  RT_CHECK(!d.pairs || B % 2 == 0, src, ": ", B, " rows cannot alternate chosen and rejected");
  RT_CHECK(B > 0, src, ": no samples");
  d.samples.resize(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    Sample& s = d.samples[b];
    const double stored_len = load_as_double(lens.bytes.data(), lens.dtype, b);
    RT_CHECK(stored_len >= 1 && stored_len <= static_cast<double>(std::min(S, spec.max_length)), src, ": lengths[", b,
             "] = ", stored_len, ": expected 1 to ", std::min(S, spec.max_length), " (S = ", S,
             ", ", spec.max_length_key, " = ", spec.max_length, ")");
    const int64_t len = static_cast<int64_t>(stored_len);
    s.input_ids.resize(static_cast<size_t>(len));
    for (int64_t p = 0; p < len; ++p) {
      int32_t id;
      std::memcpy(&id, ids.bytes.data() + (b * S + p) * 4, 4);
      RT_CHECK(id >= 0 && id < spec.vocab, src, ": input_ids[", b, ", ", p, "] = ", id, ": not a token id in [0, ",
               spec.vocab, ")");
      s.input_ids[p] = id;
    }
    s.token_mask.assign(static_cast<size_t>(len), 1.0f);
  }
  for (const char* name : kFloatFields) {
    auto it = t.find(name);
    if (it == t.end()) continue;
    const model::StoredTensor& f = it->second;
    RT_CHECK(f.dtype == DType::F32 && f.shape == std::vector<int64_t>({B, S}), src, ": ", name, " must be F32 [", B,
             ", ", S, "], got ", dtype_name(f.dtype), " ", model::shape_string(f.shape));
    for (int64_t b = 0; b < B; ++b) {
      Sample& s = d.samples[b];
      std::vector<float>& out = float_field(s, name);
      out.resize(s.input_ids.size());
      for (int64_t p = 0; p < s.length(); ++p) {
        float v;
        std::memcpy(&v, f.bytes.data() + (b * S + p) * 4, 4);
        const std::string_view field = name;
        const bool mask = field == "token_mask", logprob = field.ends_with("logprobs");
        const bool ok = mask ? (v == 0.0f || v == 1.0f) : std::isfinite(v) && (!logprob || v <= 0.0f);
        RT_CHECK(ok, src, ": ", name, "[", b, ", ", p, "] = ", v,
                 mask ? ": expected 0 or 1" : !std::isfinite(v) ? ": not finite" : ": a log-probability is at most 0");
        out[p] = v;
      }
    }
  }
  if (auto it = t.find("sample_mask"); it != t.end()) {
    const model::StoredTensor& f = it->second;
    RT_CHECK(f.dtype == DType::F32 && f.shape == std::vector<int64_t>{B}, src, ": sample_mask must be F32 [", B,
             "], got ", dtype_name(f.dtype), " ", model::shape_string(f.shape));
    for (int64_t b = 0; b < B; ++b) {
      float v;
      std::memcpy(&v, f.bytes.data() + b * 4, 4);
      RT_CHECK(v == 0.0f || v == 1.0f, src, ": sample_mask[", b, "] = ", v, ": expected 0 or 1");
      d.samples[b].sample_mask = v;
    }
  }
  if (!d.pairs) {
    for (int64_t b = 0; b < B; ++b) check_requirements(d.samples[b], spec, cat(src, ": row ", b));
  }
  // A pair trains or is left out whole (the trainer refuses a half-masked one at the step that draws it).
  for (int64_t b = 0; d.pairs && b < B; b += 2)
    RT_CHECK(d.samples[b].sample_mask == d.samples[b + 1].sample_mask, src, ": sample_mask[", b, "] = ",
             d.samples[b].sample_mask, " but sample_mask[", b + 1, "] = ", d.samples[b + 1].sample_mask,
             ": rows ", b, " and ", b + 1, " are one DPO pair (chosen, rejected) and must agree");
  return d;
}

}  // namespace

Dataset load_dataset(const std::filesystem::path& file, const DataSpec& spec) {
  std::error_code ec;
  const std::filesystem::file_type type = std::filesystem::status(file, ec).type();
  RT_CHECK(type != std::filesystem::file_type::not_found, file.string(), ": no such file",
           std::filesystem::is_symlink(file, ec) ? " (a symbolic link to nothing)" : "");
  RT_CHECK(!ec, file.string(), ": ", ec.message());  // a symlink loop, a component that is no directory, ...
  RT_CHECK(type == std::filesystem::file_type::regular, file.string(), ": not a regular file");
  if (file.extension() == ".safetensors") return read_batch_safetensors(file, spec);
  return parse_jsonl(model::read_file(file), file.string(), spec);
}

void write_batch_safetensors(const std::filesystem::path& file, const Dataset& data) {
  RT_CHECK(!data.samples.empty(), "write_batch_safetensors: no samples");
  const int64_t B = static_cast<int64_t>(data.samples.size());
  int64_t S = 0;
  for (const Sample& s : data.samples) S = std::max(S, s.length());
  model::TensorMap t;
  auto zeros = [&](DType dtype, std::vector<int64_t> shape) {
    model::StoredTensor x;
    x.dtype = dtype;
    x.shape = std::move(shape);
    x.bytes.assign(static_cast<size_t>(x.numel()) * dtype_size(dtype), '\0');
    return x;
  };
  model::StoredTensor ids = zeros(DType::I32, {B, S}), lens = zeros(DType::I32, {B});
  model::StoredTensor sample_mask = zeros(DType::F32, {B});
  for (int64_t b = 0; b < B; ++b) {
    const Sample& s = data.samples[b];
    std::memcpy(ids.bytes.data() + b * S * 4, s.input_ids.data(), s.input_ids.size() * 4);
    const int32_t len = static_cast<int32_t>(s.length());
    std::memcpy(lens.bytes.data() + b * 4, &len, 4);
    std::memcpy(sample_mask.bytes.data() + b * 4, &s.sample_mask, 4);
  }
  t["input_ids"] = std::move(ids);
  t["lengths"] = std::move(lens);
  t["sample_mask"] = std::move(sample_mask);
  for (const char* name : kFloatFields) {
    if (float_field(data.samples[0], name).empty()) continue;
    model::StoredTensor f = zeros(DType::F32, {B, S});
    for (int64_t b = 0; b < B; ++b) {
      const std::vector<float>& v = float_field(data.samples[b], name);
      RT_CHECK(static_cast<int64_t>(v.size()) == data.samples[b].length(), "write_batch_safetensors: sample ", b,
               " has ", v.size(), " ", name, " entries for ", data.samples[b].length(), " tokens");
      std::memcpy(f.bytes.data() + b * S * 4, v.data(), v.size() * 4);
    }
    t[name] = std::move(f);
  }
  model::write_safetensors(file, t);
}

namespace {

// The splitmix64 generator: well mixed, and the same on every platform (std::shuffle is not).
uint64_t next_random(uint64_t& state) {
  const uint64_t r = splitmix64(state);
  state += 0x9e3779b97f4a7c15ull;
  return r;
}

}  // namespace

BatchSchedule::BatchSchedule(int64_t units, int64_t global_batch, uint64_t seed)
    : units_(units), global_batch_(global_batch), seed_(seed) {
  RT_CHECK(global_batch >= 1, "global batch size ", global_batch, ": must be at least 1");
  RT_CHECK(units >= global_batch, "the data has ", units,
           " samples, fewer than policy.train_global_batch_size = ", global_batch, ": not one optimizer step");
}

std::vector<int64_t> BatchSchedule::step_units(int64_t step) const {
  RT_CHECK(step >= 0, "step ", step, ": must be non-negative");
  const int64_t epoch = step / steps_per_epoch(), in_epoch = step % steps_per_epoch();
  // Fisher-Yates over all units with the epoch's own stream; only this step's slice is returned.
  std::vector<int64_t> order(static_cast<size_t>(units_));
  std::iota(order.begin(), order.end(), 0);
  uint64_t state = seed_ ^ (0xd1b54a32d192ed03ull * static_cast<uint64_t>(epoch + 1));
  for (int64_t i = units_ - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(next_random(state) % static_cast<uint64_t>(i + 1));
    std::swap(order[i], order[j]);
  }
  return {order.begin() + in_epoch * global_batch_, order.begin() + (in_epoch + 1) * global_batch_};
}

std::vector<int64_t> BatchSchedule::rank_samples(int64_t step, int64_t dp, int64_t dp_rank, bool pairs) const {
  RT_CHECK(dp >= 1 && dp_rank >= 0 && dp_rank < dp && global_batch_ % dp == 0, "dp rank ", dp_rank, " of ", dp,
           " cannot share a global batch of ", global_batch_);
  const std::vector<int64_t> units = step_units(step);
  const int64_t share = global_batch_ / dp;
  std::vector<int64_t> out;
  for (int64_t i = dp_rank * share; i < (dp_rank + 1) * share; ++i) {
    if (pairs) {
      out.push_back(2 * units[i]);
      out.push_back(2 * units[i] + 1);
    } else {
      out.push_back(units[i]);
    }
  }
  return out;
}

}  // namespace ringtrain::worker
