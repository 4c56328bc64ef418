#include "ringtrain/worker/config.h"

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "ringtrain/comm/communicator.h"
#include "ringtrain/core/device_info.h"
#include "ringtrain/core/error.h"
#include "ringtrain/core/nearest_name.h"
#include "ringtrain/model/file_io.h"

namespace ringtrain::worker {
namespace {

// Configs are a few KiB; anything far larger is not one.
constexpr uintmax_t kMaxConfigBytes = 4u << 20;
// Token counts live in int32 cu_seqlens and positions.
constexpr int64_t kMaxTokens = std::numeric_limits<int32_t>::max();
constexpr int64_t kMaxBatch = int64_t{1} << 24;

// The reader's message, except where it says "bad file" for nesting past its depth limit.
std::string yaml_error_text(const YAML::Exception& e) {
  if (const auto* deep = dynamic_cast<const YAML::DeepRecursion*>(&e))
    return cat("nested ", deep->depth(), " levels deep, where the reader stops; a config is a few levels of sections");
  return e.msg;
}

// Where a value came from: "FILE:LINE" for a file, "override 'k=v'" for the command line.
struct Origin {
  std::string source;
  bool from_file = true;
  std::string at(const YAML::Node& n) const {
    if (!from_file || n.Mark().is_null()) return source;
    return cat(source, ":", n.Mark().line + 1);
  }
};

std::string node_kind(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map: return "mapping";
    case YAML::NodeType::Sequence: return "list";
    case YAML::NodeType::Null: return "null";
    default: return "value";
  }
}

// A short excerpt of a value for messages (a hostile value may be megabytes long): at most 40 bytes, on one line.
std::string excerpt(const std::string& s) {
  const std::string cut = printable(std::string_view(s).substr(0, 40), /*line_breaks=*/false);
  return s.size() <= 40 ? cut : cut + "...";
}

// The whole text of a scalar, or an error naming the key and what was found instead. A NUL (a quoted "\0" in the
// file) is refused: paths and names would end there unseen.
const std::string& scalar(const YAML::Node& n, const std::string& key, const std::string& where) {
  RT_CHECK(n.IsScalar(), where, ": ", key, ": expected a single value, got a ", node_kind(n));
  RT_CHECK(n.Scalar().find('\0') == std::string::npos, where, ": ", key, ": holds a NUL byte");
  // "?" plain, "!" quoted, "tag:yaml.org,2002:..." the core schema's (!!str, !!int, ...); a local tag (!foo) would
  // otherwise be dropped unseen.
  const std::string& tag = n.Tag();
  RT_CHECK(tag == "?" || tag == "!" || tag.starts_with("tag:yaml.org,2002:"), where, ": ", key, ": the tag '",
           excerpt(tag), "' is not one ringtrain reads (values take no tags)");
  return n.Scalar();
}

// A number's or a flag's text: a quoted or !!str scalar is a string, which YAML (and a dict's JSON) keeps apart from
// the number it spells.
const std::string& unquoted(const YAML::Node& n, const std::string& key, const std::string& where, const char* want) {
  const std::string& s = scalar(n, key, where);
  RT_CHECK(n.Tag() != "!" && n.Tag() != "tag:yaml.org,2002:str", where, ": ", key, " = \"", excerpt(s),
           "\": a string; expected ", want, " (written without quotes)");
  return s;
}

int64_t parse_int(const YAML::Node& n, const std::string& key, const std::string& where, int64_t lo, int64_t hi) {
  const std::string& s = unquoted(n, key, where, "an integer");
  int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  RT_CHECK(ec != std::errc::result_out_of_range, where, ": ", key, " = ", excerpt(s), ": out of range [", lo, ", ", hi,
           "]");
  RT_CHECK(ec == std::errc() && end == s.data() + s.size(), where, ": ", key, " = '", excerpt(s),
           "': expected an integer");
  RT_CHECK(v >= lo && v <= hi, where, ": ", key, " = ", v, ": out of range [", lo, ", ", hi, "]");
  return v;
}

uint64_t parse_uint(const YAML::Node& n, const std::string& key, const std::string& where) {
  const std::string& s = unquoted(n, key, where, "an integer");
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  RT_CHECK(ec == std::errc() && end == s.data() + s.size(), where, ": ", key, " = '", excerpt(s),
           "': expected an integer in [0, 2^64)");
  return v;
}

// "[lo, hi]", a bound one step inside a whole number shown open at that number: (0, 1] for [4.9e-324, 1], [0, 1) for
// [0, 0.9999999999999999] (which would print as [0, 1]).
std::string range_text(double lo, double hi) {
  const double below = std::nextafter(lo, -INFINITY), above = std::nextafter(hi, INFINITY);
  const bool open_lo = below == std::round(below) && lo != std::round(lo);
  const bool open_hi = above == std::round(above) && hi != std::round(hi);
  return cat(open_lo ? "(" : "[", open_lo ? below : lo, ", ", open_hi ? above : hi, open_hi ? ")" : "]");
}

double parse_double(const YAML::Node& n, const std::string& key, const std::string& where, double lo, double hi) {
  const std::string& s = unquoted(n, key, where, "a number");
  std::string lower = s;
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  const bool yaml_special = lower == ".nan" || lower == ".inf" || lower == "+.inf" || lower == "-.inf";
  RT_CHECK(!yaml_special, where, ": ", key, " = ", s, ": not a finite number");
  double v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  RT_CHECK(ec != std::errc::result_out_of_range, where, ": ", key, " = ", excerpt(s), ": not a finite number");
  RT_CHECK(ec == std::errc() && end == s.data() + s.size(), where, ": ", key, " = '", excerpt(s),
           "': expected a number");
  RT_CHECK(std::isfinite(v), where, ": ", key, " = ", excerpt(s), ": not a finite number");
  RT_CHECK(v >= lo && v <= hi, where, ": ", key, " = ", s, ": out of range ", range_text(lo, hi));
  return v;
}

bool parse_bool(const YAML::Node& n, const std::string& key, const std::string& where) {
  const std::string& s = unquoted(n, key, where, "true or false");
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  throw Error(cat(where, ": ", key, " = '", excerpt(s), "': expected true or false"));
}

template <typename E>
struct EnumName {
  E value;
  const char* name;
};

template <typename E, size_t N>
E parse_enum(const YAML::Node& n, const std::string& key, const std::string& where, const EnumName<E> (&names)[N]) {
  const std::string& s = scalar(n, key, where);
  std::string known;
  for (const auto& e : names) {
    if (s == e.name) return e.value;
    known += (known.empty() ? "" : ", ") + std::string(e.name);
  }
  throw Error(cat(where, ": ", key, " = '", excerpt(s), "': expected one of ", known));
}

template <typename E, size_t N>
std::string enum_name(E v, const EnumName<E> (&names)[N]) {
  for (const auto& e : names)
    if (e.value == v) return e.name;
  throw Error("unnamed enum value");
}

const EnumName<Precision> kPrecisions[] = {
    {Precision::Auto, "auto"},
    {Precision::BFloat16, "bfloat16"},
    {Precision::Float32, "float32"},
    {Precision::Float64, "float64"}};
const EnumName<LossType> kLossTypes[] = {
    {LossType::Nll, "nll"}, {LossType::ClippedPg, "clipped_pg"}, {LossType::Dpo, "dpo"}};
const EnumName<KlType> kKlTypes[] = {{KlType::K1, "k1"}, {KlType::K2, "k2"}, {KlType::K3, "k3"}};
const EnumName<ScheduleKind> kSchedules[] = {{ScheduleKind::Constant, "constant"}, {ScheduleKind::Cosine, "cosine"}};
const EnumName<cp::CpComm> kCpComms[] = {
    {cp::CpComm::Ring, "ring"}, {cp::CpComm::AllGather, "allgather"}, {cp::CpComm::AllToAll, "a2a"}};

// One key of the schema: how to read it into a Config and how to write it back.
struct Field {
  std::string path;  // "policy.train_micro_batch_size"
  std::string doc;
  std::function<void(Config&, const YAML::Node&, const std::string& where)> set;
  std::function<void(const Config&, YAML::Emitter&)> emit;
  std::string storage;  // the setting's own key; another key here makes this field a second name of it
};

// `get` is a generic lambda returning a reference to the field in a Config or a const Config.
template <typename Get>
Field int_field(std::string path, std::string doc, Get get, int64_t lo, int64_t hi) {
  return {path, std::move(doc),
          [=](Config& c, const YAML::Node& n, const std::string& w) { get(c) = parse_int(n, path, w, lo, hi); },
          [=](const Config& c, YAML::Emitter& e) { e << get(c); }};
}
template <typename Get>
Field double_field(std::string path, std::string doc, Get get, double lo, double hi) {
  return {path, std::move(doc),
          [=](Config& c, const YAML::Node& n, const std::string& w) { get(c) = parse_double(n, path, w, lo, hi); },
          [=](const Config& c, YAML::Emitter& e) { e << cat(get(c)); }};
}
template <typename Get>
Field bool_field(std::string path, std::string doc, Get get) {
  return {path, std::move(doc),
          [=](Config& c, const YAML::Node& n, const std::string& w) { get(c) = parse_bool(n, path, w); },
          [=](const Config& c, YAML::Emitter& e) { e << get(c); }};
}
template <typename Get>
Field string_field(std::string path, std::string doc, Get get) {
  return {path, std::move(doc),
          [=](Config& c, const YAML::Node& n, const std::string& w) {
            if (n.IsNull()) get(c).clear();
            else get(c) = scalar(n, path, w);
          },
          [=](const Config& c, YAML::Emitter& e) { e << get(c); }};
}
template <typename E, size_t N, typename Get>
Field enum_field(std::string path, std::string doc, Get get, const EnumName<E> (&names)[N]) {
  return {path, std::move(doc),
          [=, &names](Config& c, const YAML::Node& n, const std::string& w) { get(c) = parse_enum(n, path, w, names); },
          [=, &names](const Config& c, YAML::Emitter& e) { e << enum_name(get(c), names); }};
}

const std::vector<Field>& schema() {
  static const std::vector<Field> fields = [] {
    std::vector<Field> f;
    f.push_back(string_field(
        "policy.model_name", "checkpoint folder (config.json + safetensors) or builtin:<name>",
        [](auto& c) -> auto& { return c.policy.model_name; }));
    f.push_back(int_field(
        "policy.train_global_batch_size", "sequences (DPO: pairs) per optimizer step, all dp ranks",
        [](auto& c) -> auto& { return c.policy.train_global_batch_size; }, 1, kMaxBatch));
    f.push_back(int_field(
        "policy.train_micro_batch_size", "sequences (DPO: pairs) per forward/backward on a dp rank",
        [](auto& c) -> auto& { return c.policy.train_micro_batch_size; }, 1, kMaxBatch));
    f.push_back(int_field(
        "policy.logprob_batch_size", "sequences per scoring call",
        [](auto& c) -> auto& { return c.policy.logprob_batch_size; }, 1, kMaxBatch));
    f.push_back(int_field(
        "policy.max_total_sequence_length", "longest sequence (prompt + response) in tokens",
        [](auto& c) -> auto& { return c.policy.max_total_sequence_length; }, 2, kMaxTokens));
    f.push_back(enum_field(
        "policy.precision", "compute dtype: bfloat16 (GPU), float32 or float64 (CPU); auto = by device",
        [](auto& c) -> auto& { return c.policy.precision; }, kPrecisions));
    f.push_back(double_field(
        "policy.max_grad_norm", "clip gradients to this global L2 norm; 0 = no clipping",
        [](auto& c) -> auto& { return c.policy.max_grad_norm; }, 0.0, 1e30));
    f.push_back(int_field(
        "policy.logprob_chunk_size", "tokens per LM-head chunk; 0 = the device's default",
        [](auto& c) -> auto& { return c.policy.logprob_chunk_size; }, 0, kMaxTokens));
    Field cp_alias = int_field(
        "policy.dtensor_cfg.context_parallel_size", "context-parallel size (= parallel.cp)",
        [](auto& c) -> auto& { return c.parallel.cp; }, 1, comm::kMaxRanks);
    cp_alias.storage = "parallel.cp";
    f.push_back(cp_alias);
    f.push_back(bool_field(
        "policy.dtensor_cfg.activation_checkpointing", "recompute each layer's forward in backward",
        [](auto& c) -> auto& { return c.policy.dtensor_cfg.activation_checkpointing; }));
    f.push_back(int_field(
        "policy.dtensor_cfg.tensor_parallel_size", "must be 1: ringtrain has no tensor parallelism",
        [](auto& c) -> auto& { return c.policy.dtensor_cfg.tensor_parallel_size; }, 1, 1 << 16));
    f.push_back(bool_field(
        "policy.dtensor_cfg.sequence_parallel", "must be false (belongs to tensor parallelism)",
        [](auto& c) -> auto& { return c.policy.dtensor_cfg.sequence_parallel; }));
    f.push_back(bool_field(
        "policy.dtensor_cfg.cpu_offload", "must be false: ringtrain keeps weights on the device",
        [](auto& c) -> auto& { return c.policy.dtensor_cfg.cpu_offload; }));
    f.push_back(bool_field(
        "policy.sequence_packing.enabled", "pack sequences into rows of a token budget",
        [](auto& c) -> auto& { return c.policy.sequence_packing.enabled; }));
    f.push_back(int_field(
        "policy.sequence_packing.train_mb_tokens", "tokens per packed training row; 0 = max length (DPO: x 2)",
        [](auto& c) -> auto& { return c.policy.sequence_packing.train_mb_tokens; }, 0, kMaxTokens));
    f.push_back(int_field(
        "policy.sequence_packing.logprob_mb_tokens", "tokens per packed scoring row; 0 = train_mb_tokens",
        [](auto& c) -> auto& { return c.policy.sequence_packing.logprob_mb_tokens; }, 0, kMaxTokens));
    static const EnumName<int> kAlgorithms[] = {{0, "first_fit_decreasing"}};
    f.push_back({"policy.sequence_packing.algorithm", "bin packing: first_fit_decreasing",
                 [](Config& c, const YAML::Node& n, const std::string& w) {
                   c.policy.sequence_packing.algorithm =
                       kAlgorithms[parse_enum(n, "policy.sequence_packing.algorithm", w, kAlgorithms)].name;
                 },
                 [](const Config& c, YAML::Emitter& e) { e << c.policy.sequence_packing.algorithm; }});
    f.push_back(bool_field(
        "policy.dynamic_batching.enabled", "cut length-sorted sequences into microbatches of a padded-token budget",
        [](auto& c) -> auto& { return c.policy.dynamic_batching.enabled; }));
    f.push_back(int_field(
        "policy.dynamic_batching.train_mb_tokens", "padded tokens per training microbatch; 0 = max length x micro batch",
        [](auto& c) -> auto& { return c.policy.dynamic_batching.train_mb_tokens; }, 0, kMaxTokens));
    f.push_back(int_field(
        "policy.dynamic_batching.logprob_mb_tokens", "padded tokens per scoring microbatch; 0 = max length x logprob batch",
        [](auto& c) -> auto& { return c.policy.dynamic_batching.logprob_mb_tokens; }, 0, kMaxTokens));
    f.push_back(double_field(
        "policy.optimizer.kwargs.lr", "AdamW peak learning rate",
        [](auto& c) -> auto& { return c.policy.optimizer.lr; }, 0.0, 1e3));
    f.push_back(double_field(
        "policy.optimizer.kwargs.weight_decay", "AdamW decoupled weight decay",
        [](auto& c) -> auto& { return c.policy.optimizer.weight_decay; }, 0.0, 1e3));
    f.push_back({"policy.optimizer.kwargs.betas", "AdamW [beta1, beta2], each in [0, 1)",
                 [](Config& c, const YAML::Node& n, const std::string& w) {
                   const std::string key = "policy.optimizer.kwargs.betas";
                   RT_CHECK(n.IsSequence() && n.size() == 2, w, ": ", key, ": expected a list of two numbers, got a ",
                            n.IsSequence() ? cat("list of ", n.size()) : node_kind(n));
                   const double below_one = std::nextafter(1.0, 0.0);
                   c.policy.optimizer.beta1 = parse_double(n[0], key + "[0]", w, 0.0, below_one);
                   c.policy.optimizer.beta2 = parse_double(n[1], key + "[1]", w, 0.0, below_one);
                 },
                 [](const Config& c, YAML::Emitter& e) {
                   e << YAML::Flow << YAML::BeginSeq << cat(c.policy.optimizer.beta1)
                     << cat(c.policy.optimizer.beta2) << YAML::EndSeq;
                 }});
    f.push_back(double_field(
        "policy.optimizer.kwargs.eps", "AdamW denominator epsilon",
        [](auto& c) -> auto& { return c.policy.optimizer.eps; }, 0.0, 1.0));
    f.push_back(int_field(
        "policy.scheduler.warmup_steps", "linear warm-up over this many optimizer steps",
        [](auto& c) -> auto& { return c.policy.scheduler.warmup_steps; }, 0, kMaxTokens));
    f.push_back(enum_field(
        "policy.scheduler.kind", "after warm-up: constant or cosine (down to min_lr)",
        [](auto& c) -> auto& { return c.policy.scheduler.kind; }, kSchedules));
    f.push_back(double_field(
        "policy.scheduler.min_lr", "the cosine schedule's final learning rate",
        [](auto& c) -> auto& { return c.policy.scheduler.min_lr; }, 0.0, 1e3));
    f.push_back(int_field(
        "policy.scheduler.total_steps", "cosine length incl. warm-up; 0 = the run's steps (resumed: the length it was made for)",
        [](auto& c) -> auto& { return c.policy.scheduler.total_steps; }, 0, kMaxTokens));
    f.push_back(enum_field(
        "loss_fn.type", "nll (SFT), clipped_pg (GRPO/PPO) or dpo", [](auto& c) -> auto& { return c.loss_fn.type; },
        kLossTypes));
    f.push_back(double_field(
        "loss_fn.reference_policy_kl_penalty", "clipped_pg: KL-to-reference weight; dpo: beta",
        [](auto& c) -> auto& { return c.loss_fn.reference_policy_kl_penalty; }, 0.0, 1e6));
    f.push_back(enum_field(
        "loss_fn.reference_policy_kl_type", "KL estimator: k1, k2 or k3",
        [](auto& c) -> auto& { return c.loss_fn.reference_policy_kl_type; }, kKlTypes));
    f.push_back(double_field(
        "loss_fn.ratio_clip_min", "ratio clipped below at 1 - ratio_clip_min",
        [](auto& c) -> auto& { return c.loss_fn.ratio_clip_min; }, 0.0, std::nextafter(1.0, 0.0)));
    f.push_back(double_field(
        "loss_fn.ratio_clip_max", "ratio clipped above at 1 + ratio_clip_max",
        [](auto& c) -> auto& { return c.loss_fn.ratio_clip_max; }, 0.0, 1e6));
    f.push_back({"loss_fn.ratio_clip_c", "dual-clip bound (> 1) for negative advantages; null = off",
                 [](Config& c, const YAML::Node& n, const std::string& w) {
                   if (n.IsNull()) c.loss_fn.ratio_clip_c.reset();
                   else
                     c.loss_fn.ratio_clip_c = parse_double(n, "loss_fn.ratio_clip_c", w, std::nextafter(1.0, 2.0), 1e6);
                 },
                 [](const Config& c, YAML::Emitter& e) {
                   if (c.loss_fn.ratio_clip_c) e << cat(*c.loss_fn.ratio_clip_c);
                   else e << YAML::Null;
                 }});
    f.push_back(bool_field(
        "loss_fn.use_importance_sampling_correction", "weight tokens by exp(prev - generation logprobs)",
        [](auto& c) -> auto& { return c.loss_fn.use_importance_sampling_correction; }));
    f.push_back(bool_field(
        "loss_fn.token_level_loss", "true: sum / global tokens; false: per-sequence means",
        [](auto& c) -> auto& { return c.loss_fn.token_level_loss; }));
    f.push_back(double_field(
        "loss_fn.preference_loss_weight", "dpo: weight of the preference loss (the worker takes 1 only)",
        [](auto& c) -> auto& { return c.loss_fn.preference_loss_weight; }, 0.0, 1e6));
    f.push_back(double_field(
        "loss_fn.sft_loss_weight", "dpo: weight of the chosen answers' NLL (each summed over its tokens, averaged over pairs)",
        [](auto& c) -> auto& { return c.loss_fn.sft_loss_weight; }, 0.0, 1e6));
    f.push_back({"attention.backends",
                 "allow-list, most preferred first (cudnn, flash, efficient, decode, math); [] = all",
                 [](Config& c, const YAML::Node& n, const std::string& w) {
                   const std::string key = "attention.backends";
                   c.attention_backends.clear();
                   if (n.IsNull()) return;
                   RT_CHECK(n.IsSequence(), w, ": ", key, ": expected a list of backend names, got a ", node_kind(n));
                   for (size_t i = 0; i < n.size(); ++i) {
                     const std::string item = cat(key, "[", i, "]");
                     const std::string& name = scalar(n[i], item, w);  // its errors name the place already
                     attention::BackendId id;
                     try {
                       id = attention::parse_backend(name);
                     } catch (const Error& e) {
                       throw Error(cat(w, ": ", item, ": ", e.what()));
                     }
                     // As the CLI's lists: a name given twice is a slip, not a preference order.
                     for (attention::BackendId seen : c.attention_backends)
                       RT_CHECK(seen != id, w, ": ", item, " = ", attention::backend_name(id), ": listed twice in ",
                                key);
                     c.attention_backends.push_back(id);
                   }
                   // Else the run loads its model and fails at its first attention call that is not the sampler's.
                   bool other = c.attention_backends.empty();
                   for (attention::BackendId id : c.attention_backends)
                     other = other || id != attention::BackendId::Decode;
                   RT_CHECK(other, w, ": ", key, " = [decode]: decode serves only the GPU sampler's KV-cache calls; "
                            "list a backend for the model's other attention calls too (e.g. [flash, decode, math])");
                 },
                 [](const Config& c, YAML::Emitter& e) {
                   e << YAML::Flow << YAML::BeginSeq;
                   for (attention::BackendId id : c.attention_backends) e << std::string(attention::backend_name(id));
                   e << YAML::EndSeq;
                 }});
    f.push_back(int_field(
        "parallel.dp", "data-parallel size (world = dp * cp)", [](auto& c) -> auto& { return c.parallel.dp; }, 1,
        comm::kMaxRanks));
    f.push_back(int_field(
        "parallel.cp", "context-parallel size (ranks sharing each sequence)",
        [](auto& c) -> auto& { return c.parallel.cp; }, 1, comm::kMaxRanks));
    f.push_back(enum_field(
        "parallel.cp_comm",
        "ring, allgather or a2a (heads divisible by cp); a sliding window shorter than the sequence needs allgather "
        "or a2a",
        [](auto& c) -> auto& { return c.parallel.cp_comm; }, kCpComms));
    f.push_back({"device", "cpu, cuda, cuda:N or auto (a usable GPU, else cpu)",
                 [](Config& c, const YAML::Node& n, const std::string& w) {
                   const std::string& s = scalar(n, "device", w);
                   try {
                     c.device = s == "auto" ? auto_device() : parse_device(s);
                   } catch (const Error& e) {
                     throw Error(cat(w, ": device = '", excerpt(s), "': ", e.what()));
                   }
                 },
                 [](const Config& c, YAML::Emitter& e) { e << device_name(c.device); }});
    f.push_back(int_field(
        "train.steps", "optimizer steps; 0 = as many as train.epochs give",
        [](auto& c) -> auto& { return c.train.steps; }, 0, std::numeric_limits<int32_t>::max()));
    f.push_back(int_field(
        "train.epochs", "passes over the data (train); 0 = no limit; the first limit reached ends the run",
        [](auto& c) -> auto& { return c.train.epochs; }, 0, 1 << 20));
    f.push_back(string_field(
        "train.data", "JSONL rows or a .safetensors batch file", [](auto& c) -> auto& { return c.train.data; }));
    f.push_back(string_field(
        "train.checkpoint_dir", "where checkpoints go; empty = none",
        [](auto& c) -> auto& { return c.train.checkpoint_dir; }));
    f.push_back(int_field(
        "train.checkpoint_every", "optimizer steps between checkpoints; 0 = at the end only",
        [](auto& c) -> auto& { return c.train.checkpoint_every; }, 0, std::numeric_limits<int32_t>::max()));
    f.push_back(bool_field(
        "train.checkpoint_on_stop", "a run that Ctrl-C or SIGTERM stops saves its finished steps before it ends",
        [](auto& c) -> auto& { return c.train.checkpoint_on_stop; }));
    f.push_back(string_field(
        "train.metrics_dir", "metrics.jsonl and TensorBoard events; empty = none",
        [](auto& c) -> auto& { return c.train.metrics_dir; }));
    f.push_back(
        {"train.seed", "seed of data order and builtin weights",
         [](Config& c, const YAML::Node& n, const std::string& w) { c.train.seed = parse_uint(n, "train.seed", w); },
         [](const Config& c, YAML::Emitter& e) { e << std::to_string(c.train.seed); }});
    f.push_back(string_field(
        "grpo.prompts", "builtin:reverse_digits or a JSONL file of {prompt, answer}; empty = not a GRPO run",
        [](auto& c) -> auto& { return c.grpo.prompts; }));
    f.push_back(int_field(
        "grpo.num_prompts_per_step", "prompts per GRPO step",
        [](auto& c) -> auto& { return c.grpo.num_prompts_per_step; }, 1, kMaxBatch));
    f.push_back(int_field(
        "grpo.num_generations_per_prompt", "samples per prompt (the group of the advantages), at least 2",
        [](auto& c) -> auto& { return c.grpo.num_generations_per_prompt; }, 2, kMaxBatch));
    f.push_back(double_field(
        "grpo.temperature", "sampling temperature; 0 = greedy", [](auto& c) -> auto& { return c.grpo.temperature; },
        0.0, 100.0));
    f.push_back(double_field(
        "grpo.top_p", "nucleus sampling mass in (0, 1]; 1 = all", [](auto& c) -> auto& { return c.grpo.top_p; },
        std::nextafter(0.0, 1.0), 1.0));
    f.push_back(int_field(
        "grpo.top_k", "keep the k most likely tokens; 0 = all", [](auto& c) -> auto& { return c.grpo.top_k; }, 0,
        kMaxTokens));
    f.push_back(int_field(
        "grpo.max_new_tokens", "longest response in tokens", [](auto& c) -> auto& { return c.grpo.max_new_tokens; },
        1, kMaxTokens));
    static const EnumName<int> kRewards[] = {{0, "partial"}, {1, "exact"}};
    f.push_back({"grpo.reward", "partial (matching positions) or exact (0/1)",
                 [](Config& c, const YAML::Node& n, const std::string& w) {
                   c.grpo.reward = kRewards[parse_enum(n, "grpo.reward", w, kRewards)].name;
                 },
                 [](const Config& c, YAML::Emitter& e) { e << c.grpo.reward; }});
    f.push_back(int_field(
        "grpo.sft_warmup_steps", "NLL steps on the reference answers before GRPO",
        [](auto& c) -> auto& { return c.grpo.sft_warmup_steps; }, 0, std::numeric_limits<int32_t>::max()));
    f.push_back(double_field(
        "grpo.sft_warmup_lr", "the warm-up's learning rate; 0 = policy.optimizer.kwargs.lr",
        [](auto& c) -> auto& { return c.grpo.sft_warmup_lr; }, 0.0, 1e3));
    f.push_back(bool_field(
        "grpo.normalize_rewards", "divide each advantage by its group's reward std; false = Dr. GRPO",
        [](auto& c) -> auto& { return c.grpo.normalize_rewards; }));
    f.push_back(bool_field(
        "grpo.use_leave_one_out_baseline", "baseline of a sample = the mean reward of the others of its group",
        [](auto& c) -> auto& { return c.grpo.use_leave_one_out_baseline; }));
    f.push_back(int_field(
        "grpo.val_period", "validate every N GRPO steps and after the last; 0 = never",
        [](auto& c) -> auto& { return c.grpo.val_period; }, 0, std::numeric_limits<int32_t>::max()));
    f.push_back(bool_field(
        "grpo.val_at_start", "validate before the first GRPO step (after the SFT warm-up)",
        [](auto& c) -> auto& { return c.grpo.val_at_start; }));
    f.push_back(int_field(
        "grpo.max_val_samples", "held-out prompts per validation (one greedy response each)",
        [](auto& c) -> auto& { return c.grpo.max_val_samples; }, 1, kMaxBatch));
    f.push_back(string_field(
        "grpo.val_prompts", "held-out {prompt, answer} JSONL file; empty = the built-in task's held-out prompts",
        [](auto& c) -> auto& { return c.grpo.val_prompts; }));
    for (Field& x : f)
      if (x.storage.empty()) x.storage = x.path;
    return f;
  }();
  return fields;
}

const Field* find_field(const std::string& path) {
  for (const Field& f : schema())
    if (f.path == path) return &f;
  return nullptr;
}

bool is_section(const std::string& path) {
  for (const Field& f : schema())
    if (f.path.size() > path.size() && f.path.compare(0, path.size(), path) == 0 && f.path[path.size()] == '.')
      return true;
  return false;
}

// The known keys (fields and sections), for the nearest-key hint.
std::vector<std::string> known_keys() {
  std::vector<std::string> keys;
  for (const Field& f : schema()) {
    keys.push_back(f.path);
    for (size_t dot = f.path.find('.'); dot != std::string::npos; dot = f.path.find('.', dot + 1))
      keys.push_back(f.path.substr(0, dot));
  }
  return keys;
}

[[noreturn]] void unknown_key(const std::string& where, const std::string& path) {
  const std::optional<std::string> near = nearest_name(path, known_keys());
  throw Error(cat(where, ": unknown key '", excerpt(path), "'",
                  near ? cat(" (did you mean '", *near, "'?)") : std::string(" (`ringtrain config FILE` prints every key)")));
}

// Which storage each file key set, to catch two names of one setting given different values.
using Assignments = std::map<std::string, std::pair<std::string, std::string>>;  // storage -> (path, where)

void apply_map(Config& c, const YAML::Node& map, const std::string& prefix, const Origin& origin,
               Assignments& assigned) {
  std::set<std::string> keys;
  for (const auto& entry : map) {
    const YAML::Node key_node = entry.first;  // copies: the iterator hands out temporaries
    const std::string where = origin.at(key_node);
    const std::string& key = scalar(key_node, prefix.empty() ? "a top-level key" : cat("a key of ", prefix), where);
    const std::string path = prefix.empty() ? key : prefix + "." + key;
    RT_CHECK(keys.insert(key).second, where, ": duplicate key '", excerpt(path), "'");
    const YAML::Node value = entry.second;
    if (const Field* f = find_field(path)) {
      f->set(c, value, origin.at(value.IsNull() ? key_node : value));
      auto [prev, fresh] = assigned.emplace(f->storage, std::make_pair(path, where));
      RT_CHECK(fresh, where, ": ", path, " sets the same setting as ", prev->second.first, " (", prev->second.second,
               "); give only one of them");
    } else if (is_section(path)) {
      if (value.IsNull()) continue;  // an empty section keeps its defaults
      RT_CHECK(value.IsMap(), origin.at(value), ": ", path, ": expected a mapping of keys, got a ", node_kind(value));
      apply_map(c, value, path, origin, assigned);
    } else {
      unknown_key(where, path);
    }
  }
}

// yaml-cpp takes a quote left open as a value that runs on to the end of the text, folding every line after it into
// that value (the keys there then silently keep their defaults). So each quoted value must close on the line it opens
// on. Anchored nodes are walked once, however often aliases repeat them.
void check_quotes_closed(const YAML::Node& root, const std::string& text, const Origin& origin) {
  std::set<std::pair<int, int>> walked;  // (position, kind) of the mappings and lists already walked
  std::vector<YAML::Node> todo{root};
  while (!todo.empty()) {
    const YAML::Node n = todo.back();
    todo.pop_back();
    const YAML::Mark m = n.Mark();
    if (n.IsMap() || n.IsSequence()) {
      if (!m.is_null() && !walked.emplace(m.pos, static_cast<int>(n.Type())).second) continue;
      if (n.IsMap()) {
        for (auto it = n.begin(); it != n.end(); ++it) {
          todo.push_back(it->first);
          todo.push_back(it->second);
        }
      } else {
        for (const YAML::Node& item : n) todo.push_back(item);
      }
      continue;
    }
    if (!n.IsScalar() || n.Tag() != "!" || m.is_null() || m.pos < 0 || static_cast<size_t>(m.pos) >= text.size())
      continue;
    const char quote = text[static_cast<size_t>(m.pos)];
    if (quote != '"' && quote != '\'') continue;  // a block value (| or >)
    size_t i = static_cast<size_t>(m.pos) + 1;
    for (; i < text.size() && text[i] != '\n'; ++i) {
      if (quote == '"' && text[i] == '\\') {
        ++i;  // an escape: `\"` is no end, and `\` at the line's end continues the value on the next line
      } else if (text[i] == quote) {
        if (quote == '\'' && i + 1 < text.size() && text[i + 1] == '\'') ++i;  // '' inside '...' is one quote
        else break;
      }
    }
    RT_CHECK(i < text.size() && text[i] == quote, origin.at(n), origin.from_file ? cat(":", m.column + 1) : "",
             ": the value ", quote,
             excerpt(n.Scalar()), " is not closed on its line (YAML would take every line after it into the value): "
             "close the quote");
  }
}

// Returns the setting it assigned (two overrides naming one setting by its two keys are an error).
std::string apply_override(Config& c, const std::string& text) {
  const std::string where = cat("override '", excerpt(text), "'");
  // The YAML parser stops at a NUL (one can come from Python), which would cut the value short unseen.
  RT_CHECK(text.find('\0') == std::string::npos, where, ": holds a NUL byte");
  const size_t eq = text.find('=');
  RT_CHECK(eq != std::string::npos && eq > 0, where, ": expected KEY=VALUE (e.g. policy.train_micro_batch_size=2)");
  const std::string key = text.substr(0, eq);
  const Field* f = find_field(key);
  if (!f) {
    RT_CHECK(!is_section(key), where, ": ", key, " is a section; override one of its keys (KEY.SUBKEY=VALUE)");
    unknown_key(where, key);
  }
  YAML::Node value;
  const std::string value_text = text.substr(eq + 1);
  // The YAML reader takes a leading byte-order mark for the text's encoding and drops it, with what it would decode.
  for (const std::string_view bom : {"\xEF\xBB\xBF", "\xFE\xFF", "\xFF\xFE"})
    RT_CHECK(!value_text.starts_with(bom), where,
             ": the value starts with a byte-order mark, which YAML would take for the text's encoding; quote it");
  try {
    const size_t documents = YAML::LoadAll(value_text).size();  // Load would read the first and drop the others
    RT_CHECK(documents <= 1, where, ": the value holds ", documents, " YAML documents (separated by ---); quote it");
    value = YAML::Load(value_text);
  } catch (const YAML::Exception& e) {
    throw Error(cat(where, ": the value is not YAML: ", yaml_error_text(e)));
  }
  check_quotes_closed(value, value_text, Origin{where, false});
  f->set(c, value, where);
  return f->storage;
}

}  // namespace

Config parse_config(const std::string& yaml_text, const std::string& source,
                    const std::vector<std::string>& overrides, ConfigUse use) {
  YAML::Node root;
  try {
    const std::vector<YAML::Node> docs = YAML::LoadAll(yaml_text);
    RT_CHECK(docs.size() <= 1, source, ": ", docs.size(), " YAML documents (separated by ---); a config is one");
    if (!docs.empty()) root = docs.front();
  } catch (const YAML::Exception& e) {
    throw Error(cat(source, ":", e.mark.line + 1, ":", e.mark.column + 1, ": YAML error: ", yaml_error_text(e)));
  }
  check_quotes_closed(root, yaml_text, Origin{source, true});
  RT_CHECK(!root.IsNull(), source, ": empty config (expected a mapping of sections: policy, loss_fn, train, ...)");
  RT_CHECK(root.IsMap(), source, ": expected a mapping of sections (policy, loss_fn, train, ...), got a ",
           node_kind(root));
  Config c;
  Assignments assigned;
  apply_map(c, root, "", Origin{source, true}, assigned);
  std::map<std::string, std::string> overridden;  // setting -> the override's key
  for (const std::string& o : overrides) {
    const std::string key = o.substr(0, o.find('='));
    const auto [prev, fresh] = overridden.emplace(apply_override(c, o), key);
    RT_CHECK(fresh || prev->second == key, "override '", excerpt(o), "' sets the same setting as the override of ",
             prev->second, "; give only one of them");
  }
  if (c.policy.precision == Precision::Auto)
    c.policy.precision = c.device.kind == DeviceKind::CPU ? Precision::Float32 : Precision::BFloat16;
  c.validate(use);
  return c;
}

Config load_config(const std::filesystem::path& file, const std::vector<std::string>& overrides, ConfigUse use) {
  std::error_code ec;
  const auto status = std::filesystem::status(file, ec);
  RT_CHECK(status.type() != std::filesystem::file_type::not_found, file.string(), ": no such config file");
  RT_CHECK(!ec, file.string(), ": ", ec.message());  // a symlink loop, a component that is no directory, ...
  RT_CHECK(std::filesystem::is_regular_file(status), file.string(), ": not a regular file");
  const uintmax_t size = std::filesystem::file_size(file, ec);
  RT_CHECK(!ec && size <= kMaxConfigBytes, file.string(), ": ", size, " bytes is too large for a config (at most ",
           kMaxConfigBytes, ")");
  return parse_config(model::read_file(file), file.string(), overrides, use);
}

std::string to_yaml(const Config& c) {
  YAML::Emitter e;
  e << YAML::BeginMap;
  std::vector<std::string> open;  // the sections currently open, outermost first
  for (const Field& f : schema()) {
    if (f.storage != f.path) continue;  // a second name of a setting printed under its own name
    std::vector<std::string> parts;
    for (size_t start = 0;;) {
      const size_t dot = f.path.find('.', start);
      parts.push_back(f.path.substr(start, dot - start));
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    const std::vector<std::string> sections(parts.begin(), parts.end() - 1);
    size_t common = 0;
    while (common < open.size() && common < sections.size() && open[common] == sections[common]) ++common;
    for (size_t i = open.size(); i > common; --i) e << YAML::EndMap;
    open.resize(common);
    for (size_t i = common; i < sections.size(); ++i) {
      e << YAML::Key << sections[i] << YAML::Value << YAML::BeginMap;
      open.push_back(sections[i]);
    }
    e << YAML::Key << parts.back() << YAML::Value;
    f.emit(c, e);
    e << YAML::Comment(f.doc);
  }
  for (size_t i = 0; i < open.size(); ++i) e << YAML::EndMap;
  e << YAML::EndMap;
  RT_CHECK(e.good(), "cannot write the config as YAML: ", e.GetLastError());
  return std::string(e.c_str()) + "\n";
}

void Config::validate(ConfigUse use) const {
  RT_CHECK(!policy.model_name.empty(), "policy.model_name is required (a checkpoint folder or builtin:<name>)");
  if (is_builtin_model(policy.model_name)) resolve_model_config(policy);  // an unknown builtin name fails here
  RT_CHECK(use == ConfigUse::Worker || !train.data.empty() || !grpo.prompts.empty(),
           "train.data is required (a JSONL or .safetensors file), or grpo.prompts for a GRPO run");
  RT_CHECK(parallel.world() <= comm::kMaxRanks, "parallel.dp (", parallel.dp, ") x parallel.cp (", parallel.cp,
           ") = ", parallel.world(), " ranks: at most ", comm::kMaxRanks);
  RT_CHECK(policy.dtensor_cfg.tensor_parallel_size == 1,
           "policy.dtensor_cfg.tensor_parallel_size = ", policy.dtensor_cfg.tensor_parallel_size,
           ": ringtrain has no tensor parallelism (use parallel.dp / cp)");
  RT_CHECK(!policy.dtensor_cfg.sequence_parallel,
           "policy.dtensor_cfg.sequence_parallel: needs tensor parallelism, "
           "which ringtrain does not have");
  RT_CHECK(!policy.dtensor_cfg.cpu_offload, "policy.dtensor_cfg.cpu_offload: not supported");

  const bool cpu = device.kind == DeviceKind::CPU;
  RT_CHECK(policy.precision == Precision::Auto || cpu != (policy.precision == Precision::BFloat16),
           "policy.precision = ", precision_name(policy.precision),
           " with device ", device_name(device),
           ": the CPU policy computes in float32 or float64, the GPU policy in "
           "bfloat16");
  // Microbatches of train_micro_batch_size sequences, or (packing, dynamic batching) of train_mb_tokens, which
  // leave the sequence count free: each dp rank takes an equal share.
  if (policy.sequence_packing.enabled || policy.dynamic_batching.enabled) {
    RT_CHECK(policy.train_global_batch_size % parallel.dp == 0, "policy.train_global_batch_size = ",
             policy.train_global_batch_size, " must be a multiple of parallel.dp = ", parallel.dp);
  } else {
    const int64_t per_step = parallel.dp * policy.train_micro_batch_size;  // both at most 2^24: no overflow
    RT_CHECK(policy.train_global_batch_size % per_step == 0, "policy.train_global_batch_size = ",
             policy.train_global_batch_size, " must be a multiple of parallel.dp (", parallel.dp,
             ") x policy.train_micro_batch_size (", policy.train_micro_batch_size, ") = ", per_step);
  }
  RT_CHECK(policy.optimizer.eps > 0, "policy.optimizer.kwargs.eps = ", policy.optimizer.eps,
           ": must be > 0 (AdamW divides by sqrt(v) + eps, and v is 0 where a gradient is)");
  RT_CHECK(loss_fn.type != LossType::Dpo || loss_fn.preference_loss_weight == 1.0,
           "loss_fn.preference_loss_weight = ", loss_fn.preference_loss_weight,
           ": the worker's DPO loss weighs the preference term 1 (scale loss_fn.sft_loss_weight instead)");
  RT_CHECK(loss_fn.type != LossType::Dpo || loss_fn.reference_policy_kl_penalty > 0,
           "loss_fn.reference_policy_kl_penalty = ", loss_fn.reference_policy_kl_penalty,
           ": with loss_fn.type = dpo it is DPO's beta and must be > 0 (0.1 is usual)");
  RT_CHECK(!(policy.sequence_packing.enabled && policy.dynamic_batching.enabled),
           "policy.sequence_packing.enabled and policy.dynamic_batching.enabled: choose one way to form microbatches");
  if (policy.sequence_packing.enabled || policy.dynamic_batching.enabled) {
    const std::string section = policy.sequence_packing.enabled ? "sequence_packing" : "dynamic_batching";
    // A training unit is a sequence, or a DPO pair that stays in one microbatch.
    const int64_t train_unit = policy.max_total_sequence_length * (loss_fn.type == LossType::Dpo ? 2 : 1);
    RT_CHECK(train_mb_tokens() >= train_unit, "policy.", section, ".train_mb_tokens = ", train_mb_tokens(),
             " is below the longest training unit, ", train_unit, " tokens (policy.max_total_sequence_length",
             loss_fn.type == LossType::Dpo ? " x 2 for a DPO pair" : "", "): it must fit one microbatch");
    RT_CHECK(logprob_mb_tokens() >= policy.max_total_sequence_length, "policy.", section, ".logprob_mb_tokens = ",
             logprob_mb_tokens(), " is below policy.max_total_sequence_length = ", policy.max_total_sequence_length,
             ": the longest sequence must fit one microbatch");
  }
  const SchedulerConfig& s = policy.scheduler;
  RT_CHECK(s.min_lr <= policy.optimizer.lr, "policy.scheduler.min_lr = ", s.min_lr,
           " is above policy.optimizer.kwargs.lr = ", policy.optimizer.lr);
  // With neither total_steps nor train.steps the length comes from the data's epochs, checked when the run starts.
  if (s.kind == ScheduleKind::Cosine && total_scheduler_steps() > 0) {
    RT_CHECK(total_scheduler_steps() > s.warmup_steps, "policy.scheduler.kind = cosine needs total_steps (",
             total_scheduler_steps(), ", or train.steps when 0) above policy.scheduler.warmup_steps (", s.warmup_steps,
             ")");
  }
  RT_CHECK(train.steps > 0 || train.epochs > 0, "train.steps and train.epochs are both 0: the run would never start");
  RT_CHECK(train.checkpoint_every == 0 || !train.checkpoint_dir.empty(),
           "train.checkpoint_every = ", train.checkpoint_every, " needs train.checkpoint_dir");
  // With train.data too, the grpo section may be one that `ringtrain train` leaves unused (and names so).
  if (!grpo.prompts.empty() && train.data.empty()) validate_grpo();
}

void Config::validate_grpo() const {
  RT_CHECK(train.steps > 0, "train.steps = 0: a GRPO run needs its number of steps (grpo.prompts is set)");
  const int64_t batch = grpo.num_prompts_per_step * grpo.num_generations_per_prompt;  // both at most 2^24
  RT_CHECK(batch == policy.train_global_batch_size, "grpo.num_prompts_per_step (", grpo.num_prompts_per_step,
           ") x grpo.num_generations_per_prompt (", grpo.num_generations_per_prompt, ") = ", batch,
           " must equal policy.train_global_batch_size = ", policy.train_global_batch_size);
}

void Config::validate_against(const model::ModelConfig& m) const {
  const std::string& name = policy.model_name;
  RT_CHECK(policy.max_total_sequence_length <= m.max_positions,
           "policy.max_total_sequence_length = ", policy.max_total_sequence_length,
           " exceeds the model's max_position_embeddings = ", m.max_positions, " (", name, ")");
  try {
    model::check_sequence_supported(m, policy.max_total_sequence_length);
  } catch (const Error& e) {
    throw Error(
        cat("policy.max_total_sequence_length = ", policy.max_total_sequence_length, " (", name, "): ", e.what()));
  }
  try {
    model::check_context_parallel_supported(m, policy.max_total_sequence_length, parallel.cp, parallel.cp_comm);
  } catch (const Error& e) {
    throw Error(cat(name, ": ", e.what()));
  }
}

Device auto_device() { return hopper_unavailable_reason(Device::cuda(0)).empty() ? Device::cuda(0) : Device::cpu(); }

DType Config::compute_dtype() const {
  switch (policy.precision) {
    case Precision::Auto: return device.kind == DeviceKind::CPU ? DType::F32 : DType::BF16;
    case Precision::BFloat16: return DType::BF16;
    case Precision::Float32: return DType::F32;
    case Precision::Float64: return DType::F64;
  }
  throw Error("unknown precision");
}

int64_t Config::local_batch_sequences() const {
  const int64_t per_rank = policy.train_global_batch_size / parallel.dp;
  return loss_fn.type == LossType::Dpo ? 2 * per_rank : per_rank;
}

int64_t Config::train_mb_tokens() const {
  const int64_t pair = loss_fn.type == LossType::Dpo ? 2 : 1;
  if (policy.sequence_packing.enabled) {
    const int64_t t = policy.sequence_packing.train_mb_tokens;
    return t > 0 ? t : policy.max_total_sequence_length * pair;
  }
  if (policy.dynamic_batching.enabled) {
    const int64_t t = policy.dynamic_batching.train_mb_tokens;
    return t > 0 ? t : policy.max_total_sequence_length * policy.train_micro_batch_size * pair;  // < 2^56
  }
  return 0;
}

int64_t Config::logprob_mb_tokens() const {
  if (policy.sequence_packing.enabled) {
    const int64_t t = policy.sequence_packing.logprob_mb_tokens;
    return t > 0 ? t : train_mb_tokens();
  }
  if (policy.dynamic_batching.enabled) {
    const int64_t t = policy.dynamic_batching.logprob_mb_tokens;
    return t > 0 ? t : policy.max_total_sequence_length * policy.logprob_batch_size;
  }
  return 0;
}

int64_t Config::total_scheduler_steps() const {
  return policy.scheduler.total_steps > 0 ? policy.scheduler.total_steps : train.steps;
}

std::string_view precision_name(Precision p) {
  for (const auto& e : kPrecisions)
    if (e.value == p) return e.name;
  return "?";
}

std::string_view loss_type_name(LossType t) {
  for (const auto& e : kLossTypes)
    if (e.value == t) return e.name;
  return "?";
}

namespace {

constexpr std::string_view kBuiltinPrefix = "builtin:";

// Small shapes for tests and examples, and the Llama-3.2-1B shape of `bench model` for timing.
model::ModelConfig builtin_shape(const std::string& name) {
  model::ModelConfig c;
  if (name == "tiny") {
    c.arch = model::Arch::Llama;
    c.vocab = 256, c.hidden = 64, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.head_dim = 16, c.ffn = 128;
    c.max_positions = 8192;
  } else if (name == "char-tiny") {
    // The policy of the built-in RL task: vocabulary = rl::CharTokenizer's 53 ids, about 81K parameters.
    c.arch = model::Arch::Llama;
    c.vocab = 53, c.hidden = 64, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.head_dim = 16, c.ffn = 128;
    c.max_positions = 64;
    c.rms_eps = 1e-5;
  } else if (name == "small") {
    c.arch = model::Arch::Qwen3;
    c.qk_norm = true;
    c.vocab = 4096, c.hidden = 256, c.layers = 4, c.heads = 8, c.kv_heads = 4, c.head_dim = 32, c.ffn = 768;
    c.max_positions = 32768;
  } else if (name == "llama-3.2-1b") {
    c.arch = model::Arch::Llama;
    c.vocab = 128256, c.hidden = 2048, c.layers = 16, c.heads = 32, c.kv_heads = 8, c.head_dim = 64, c.ffn = 8192;
    c.max_positions = 131072;
    c.tie_embeddings = true;
    c.rms_eps = 1e-5;
    c.rope.theta = 500000.0;
    c.rope.llama3 = true;
    c.rope.factor = 32.0;
    c.rope.original_max_position = 8192;
    c.dtype = DType::BF16;
  } else {
    std::string known;
    for (const std::string& n : builtin_model_names()) known += (known.empty() ? "" : ", ") + n;
    throw Error(cat("policy.model_name = builtin:", excerpt(name), ": unknown builtin model (known: ", known, ")"));
  }
  return model::parse_config(model::config_to_json(c), "builtin:" + name);
}

}  // namespace

bool is_builtin_model(const std::string& model_name) { return model_name.starts_with(kBuiltinPrefix); }

std::vector<std::string> builtin_model_names() { return {"tiny", "char-tiny", "small", "llama-3.2-1b"}; }

model::ModelConfig resolve_model_config(const PolicyConfig& policy) {
  if (is_builtin_model(policy.model_name)) return builtin_shape(policy.model_name.substr(kBuiltinPrefix.size()));
  return model::load_config(policy.model_name);
}

}  // namespace ringtrain::worker
