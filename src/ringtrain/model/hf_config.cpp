#include "ringtrain/model/hf_config.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <optional>

#include "ringtrain/attention/params.h"
#include "ringtrain/core/checked.h"
#include "ringtrain/core/error.h"
#include "ringtrain/core/json.h"
#include "ringtrain/model/file_io.h"

namespace ringtrain::model {
namespace {

using nlohmann::json;

// Upper bounds on the sizes of a config: several times the largest released models, small enough that every
// product of two of them (a weight matrix) and the whole layout stay far inside 64 bits and that a hostile file
// fails here rather than in an allocation.
constexpr int64_t kMaxVocab = int64_t{1} << 24;
constexpr int64_t kMaxWidth = int64_t{1} << 20;  // hidden_size, intermediate_size, heads x head_dim
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxHeads = 4096;
constexpr int64_t kMaxHeadDim = 4096;
constexpr int64_t kMaxPositions = int64_t{1} << 30;

struct Reader {
  const json& j;
  const std::string& source;

  bool has(const char* key) const { return j.contains(key) && !j.at(key).is_null(); }
  [[noreturn]] void bad(const char* key, const std::string& why) const {
    throw Error(cat(source, ": key '", key, "' = ", j.contains(key) ? json_excerpt(j.at(key)) : "(missing)", ": ", why));
  }
  int64_t integer(const char* key) const {
    if (!has(key)) bad(key, "required integer is missing");
    if (!j.at(key).is_number_integer()) bad(key, "expected an integer");
    return j.at(key).get<int64_t>();
  }
  int64_t integer_or(const char* key, int64_t dflt) const { return has(key) ? integer(key) : dflt; }
  int64_t positive(const char* key, int64_t max) const {
    const int64_t v = integer(key);
    if (v <= 0 || v > max) bad(key, cat("must be in [1, ", max, "]"));
    return v;
  }
  double number_or(const char* key, double dflt) const {
    if (!has(key)) return dflt;
    if (!j.at(key).is_number()) bad(key, "expected a number");
    const double v = j.at(key).get<double>();
    if (!std::isfinite(v)) bad(key, "must be finite");
    return v;
  }
  bool boolean_or(const char* key, bool dflt) const {
    if (!has(key)) return dflt;
    if (!j.at(key).is_boolean()) bad(key, "expected true or false");
    return j.at(key).get<bool>();
  }
  std::string string_or(const char* key, const std::string& dflt) const {
    if (!has(key)) return dflt;
    if (!j.at(key).is_string()) bad(key, "expected a string");
    return j.at(key).get<std::string>();
  }
};

// The architecture from "architectures" or "model_type". Where both are given they must agree: transformers builds
// the model from model_type, and the two differ in the math (a window, biases), so a mismatch is refused, not
// resolved either way.
Arch arch_from_json(const Reader& r) {
  constexpr Arch kArchs[] = {Arch::Llama, Arch::Qwen2, Arch::Qwen3, Arch::Mistral};
  std::optional<Arch> by_class;
  if (r.has("architectures")) {
    const json& a = r.j.at("architectures");
    if (!a.is_array() || a.size() != 1 || !a[0].is_string()) r.bad("architectures", "expected one class name");
    const std::string name = a[0].get<std::string>();
    for (Arch arch : kArchs)
      if (name == arch_class_name(arch)) by_class = arch;
    if (!by_class)
      r.bad("architectures", "unsupported (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM)");
  }
  if (!r.has("model_type")) {
    if (!by_class) r.bad("model_type", "missing, and no 'architectures' (llama, qwen2, qwen3, mistral)");
    return *by_class;
  }
  const std::string type = r.string_or("model_type", "");
  for (Arch arch : kArchs) {
    if (type != arch_model_type(arch)) continue;
    if (by_class && *by_class != arch)
      r.bad("model_type", cat("disagrees with 'architectures' = ", arch_class_name(*by_class), " (model_type '",
                              arch_model_type(*by_class), "'); transformers builds the model from model_type"));
    return arch;
  }
  r.bad("model_type", "unsupported (llama, qwen2, qwen3, mistral)");
}

// RoPE: transformers 5 writes "rope_parameters" {rope_type, rope_theta, ...}; older files "rope_theta" and
// "rope_scaling" {rope_type|type, ...}.
// Every key that changes the rotation is read or refused: one left unread would run other math than transformers.
RopeConfig rope_from_json(const Reader& r) {
  RopeConfig rope;
  const char* obj_key = r.has("rope_parameters") ? "rope_parameters" : "rope_scaling";
  rope.theta = r.number_or("rope_theta", rope.theta);
  if (!(rope.theta > 0)) r.bad("rope_theta", "must be positive");
  if (r.number_or("partial_rotary_factor", 1.0) != 1.0) r.bad("partial_rotary_factor", "only 1.0 is supported");
  if (!r.has(obj_key)) return rope;
  const json& s = r.j.at(obj_key);
  if (!s.is_object()) r.bad(obj_key, "expected an object");
  const std::string src = cat(r.source, ": ", obj_key);
  const Reader sr{s, src};
  for (const auto& [key, value] : s.items()) {
    constexpr const char* kKnown[] = {"rope_type", "type", "rope_theta", "partial_rotary_factor", "factor",
                                      "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"};
    if (std::find(std::begin(kKnown), std::end(kKnown), key) == std::end(kKnown))
      sr.bad(key.c_str(), value.is_object() ? "RoPE parameters per layer type are not supported"
                                            : "not a RoPE parameter this reader knows (rope_type, rope_theta, "
                                              "factor, low_freq_factor, high_freq_factor, "
                                              "original_max_position_embeddings)");
  }
  rope.theta = sr.number_or("rope_theta", rope.theta);
  if (!(rope.theta > 0)) sr.bad("rope_theta", "must be positive");
  if (sr.number_or("partial_rotary_factor", 1.0) != 1.0) sr.bad("partial_rotary_factor", "only 1.0 is supported");
  // transformers looks the type up and fails without one; scaling values with no type would otherwise go unread.
  if (!sr.has("rope_type") && !sr.has("type") && (sr.has("factor") || sr.has("low_freq_factor") ||
                                                   sr.has("high_freq_factor") ||
                                                   sr.has("original_max_position_embeddings")))
    r.bad(obj_key, "gives scaling values but no 'rope_type' (or 'type')");
  const std::string type = sr.has("rope_type") ? sr.string_or("rope_type", "") : sr.string_or("type", "default");
  if (type == "default") return rope;
  if (type != "llama3") sr.bad(sr.has("rope_type") ? "rope_type" : "type", "unsupported (default, llama3)");
  rope.llama3 = true;
  rope.factor = sr.number_or("factor", 0);
  rope.low_freq_factor = sr.number_or("low_freq_factor", 0);
  rope.high_freq_factor = sr.number_or("high_freq_factor", 0);
  rope.original_max_position = sr.integer_or("original_max_position_embeddings", 0);
  if (rope.original_max_position > kMaxPositions) sr.bad("original_max_position_embeddings", cat("must be at most ", kMaxPositions));
  if (rope.factor <= 0) sr.bad("factor", "llama3 scaling needs a positive factor");
  if (rope.low_freq_factor <= 0) sr.bad("low_freq_factor", "llama3 scaling needs a positive value");
  if (rope.high_freq_factor <= rope.low_freq_factor) sr.bad("high_freq_factor", "must exceed low_freq_factor");
  if (rope.original_max_position <= 0) sr.bad("original_max_position_embeddings", "must be positive");
  return rope;
}

// Which layers are windowed, as transformers decides: Mistral windows every layer when sliding_window is set;
// Qwen2/Qwen3 drop the window unless use_sliding_window, then window the layers that "layer_types" names
// "sliding_attention", or, without layer_types, the layers from max_window_layers on (default 28); Llama none.
// Leaves c.sliding_window = 0 when no layer is windowed.
void sliding_window_from_json(const Reader& r, ModelConfig& c) {
  c.sliding_window = 0, c.full_attention_layers.clear();
  if (c.arch == Arch::Llama) return;
  // A missing key takes transformers' default (4096 for all three configs); null is no window.
  constexpr int64_t kDefaultWindow = 4096;
  const int64_t w = r.has("sliding_window")        ? r.integer("sliding_window")
                    : r.j.contains("sliding_window") ? 0
                                                     : kDefaultWindow;
  if (r.has("sliding_window") && (w <= 0 || w > kMaxPositions))
    r.bad("sliding_window", cat("must be in [1, ", kMaxPositions, "] or null"));
  if (c.arch == Arch::Mistral) {
    c.sliding_window = w;
    return;
  }
  std::vector<bool> full(static_cast<size_t>(c.layers));
  if (r.has("layer_types")) {
    const json& lt = r.j.at("layer_types");
    if (!lt.is_array() || static_cast<int64_t>(lt.size()) != c.layers)
      r.bad("layer_types", cat("expected a list of num_hidden_layers = ", c.layers, " layer types"));
    for (size_t l = 0; l < lt.size(); ++l) {
      if (lt[l] != "sliding_attention" && lt[l] != "full_attention")
        r.bad("layer_types", cat("entry ", l, " = ", json_excerpt(lt[l]), ": expected \"sliding_attention\" or "
                                 "\"full_attention\""));
      full[l] = lt[l] == "full_attention";
    }
  } else {
    const int64_t first = r.integer_or("max_window_layers", 28);
    if (first < 0) r.bad("max_window_layers", "must not be negative");
    for (int64_t l = 0; l < c.layers && l < first; ++l) full[static_cast<size_t>(l)] = true;
  }
  if (w == 0 || !r.boolean_or("use_sliding_window", false)) return;
  if (std::find(full.begin(), full.end(), false) == full.end()) return;
  c.sliding_window = w;
  if (std::find(full.begin(), full.end(), true) != full.end()) c.full_attention_layers = std::move(full);
}

}  // namespace

const std::vector<std::string>& hf_companion_files() {
  static const std::vector<std::string> names = {
      "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
      "tokenizer.model",        "vocab.json",     "merges.txt",            "added_tokens.json",
      "chat_template.jinja",    "chat_template.json"};
  return names;
}

CompanionFiles read_hf_companion_files(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  constexpr uintmax_t kMaxBytes = uintmax_t{1} << 30;  // tokenizers are a few tens of MB
  std::error_code ec;
  RT_CHECK(fs::is_directory(dir, ec), dir.string(), ", where the tokenizer and generation files come from, is not a "
           "directory");
  CompanionFiles files;
  for (const std::string& name : hf_companion_files()) {
    const fs::path src = dir / name;
    const fs::file_status st = fs::status(src, ec);
    if (st.type() == fs::file_type::not_found) continue;
    RT_CHECK(!ec, src.string(), ": ", ec.message());
    RT_CHECK(st.type() == fs::file_type::regular, src.string(), ": not a regular file; ", name,
             " is copied as a file with the model");
    const uintmax_t size = fs::file_size(src, ec);
    RT_CHECK(!ec && size <= kMaxBytes, src.string(), ": ", size, " bytes; a companion file of a model is at most ",
             kMaxBytes);
    files.emplace_back(name, read_file(src));
  }
  return files;
}

void write_hf_companion_files(const std::filesystem::path& dir, const CompanionFiles& files) {
  for (const auto& [name, content] : files) write_file_atomic(dir / name, content);
}

std::string arch_class_name(Arch a) {
  switch (a) {
    case Arch::Llama: return "LlamaForCausalLM";
    case Arch::Qwen2: return "Qwen2ForCausalLM";
    case Arch::Qwen3: return "Qwen3ForCausalLM";
    case Arch::Mistral: return "MistralForCausalLM";
  }
  return "?";
}

std::string arch_model_type(Arch a) {
  switch (a) {
    case Arch::Llama: return "llama";
    case Arch::Qwen2: return "qwen2";
    case Arch::Qwen3: return "qwen3";
    case Arch::Mistral: return "mistral";
  }
  return "?";
}

Arch parse_arch(const std::string& n) {
  for (Arch a : {Arch::Llama, Arch::Qwen2, Arch::Qwen3, Arch::Mistral})
    if (n == arch_model_type(a)) return a;
  throw Error(cat("unknown architecture '", n, "' (expected llama, qwen2, qwen3 or mistral)"));
}

ModelConfig parse_config(const json& j, const std::string& source) {
  RT_CHECK(j.is_object(), source, ": expected a JSON object");
  const Reader r{j, source};
  ModelConfig c;
  c.arch = arch_from_json(r);
  c.vocab = r.positive("vocab_size", kMaxVocab);
  c.hidden = r.positive("hidden_size", kMaxWidth);
  c.ffn = r.positive("intermediate_size", kMaxWidth);
  c.layers = r.positive("num_hidden_layers", kMaxLayers);
  c.heads = r.positive("num_attention_heads", kMaxHeads);
  c.kv_heads = r.has("num_key_value_heads") ? r.positive("num_key_value_heads", kMaxHeads) : c.heads;
  if (c.heads % c.kv_heads != 0) r.bad("num_key_value_heads", cat("must divide num_attention_heads = ", c.heads));
  if (r.has("head_dim")) {
    c.head_dim = r.positive("head_dim", kMaxHeadDim);
  } else {
    if (c.hidden % c.heads != 0) r.bad("hidden_size", cat("not divisible by num_attention_heads = ", c.heads));
    c.head_dim = c.hidden / c.heads;
  }
  if (c.head_dim % 2 != 0) r.bad("head_dim", "RoPE needs an even head dimension");
  if (c.head_dim > kMaxHeadDim) r.bad("hidden_size", cat("gives head_dim ", c.head_dim, " above ", kMaxHeadDim));
  if (c.heads * c.head_dim > kMaxWidth)
    r.bad("num_attention_heads", cat("x head_dim = ", c.heads * c.head_dim, " exceeds ", kMaxWidth));
  if (r.has("max_position_embeddings")) c.max_positions = r.positive("max_position_embeddings", kMaxPositions);
  c.rms_eps = r.number_or("rms_norm_eps", c.rms_eps);
  if (!(c.rms_eps > 0)) r.bad("rms_norm_eps", "must be positive");
  c.tie_embeddings = r.boolean_or("tie_word_embeddings", false);
  const std::string act = r.string_or("hidden_act", "silu");
  if (act != "silu") r.bad("hidden_act", "unsupported (silu)");
  if (r.boolean_or("mlp_bias", false)) r.bad("mlp_bias", "MLP biases are not supported");
  if (r.number_or("attention_dropout", 0.0) != 0.0) r.bad("attention_dropout", "dropout is not supported");
  if (r.integer_or("pretraining_tp", 1) != 1) r.bad("pretraining_tp", "only 1 is supported");
  // A quantized checkpoint's tensors are not the weights (packed integers and scales): its names would be refused or
  // mistaken for the weights later, so the config says why first.
  if (r.has("quantization_config") && !r.j.at("quantization_config").is_null())
    r.bad("quantization_config", "quantized checkpoints are not supported (bf16, fp16 or fp32 weights)");
  const bool attention_bias = r.boolean_or("attention_bias", false);
  if (c.arch == Arch::Qwen2) {
    c.qkv_bias = true;
  } else if (c.arch == Arch::Mistral) {
    if (attention_bias) r.bad("attention_bias", "MistralForCausalLM has no attention biases");
  } else {
    c.qkv_bias = c.o_bias = attention_bias;
  }
  c.qk_norm = c.arch == Arch::Qwen3;
  c.rope = rope_from_json(r);
  sliding_window_from_json(r, c);
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
    if (!r.j.contains(key)) continue;
    // Kept as given, unchecked against the vocabulary: no weight depends on them, and released configs hold ids
    // such as a pad_token_id of -1.
    const json& v = r.j.at(key);
    const auto is_id = [](const json& x) { return x.is_number_integer(); };
    const bool ok = v.is_null() || is_id(v) ||
                    (v.is_array() && !v.empty() && v.size() <= 64 && std::all_of(v.begin(), v.end(), is_id));
    if (!ok) r.bad(key, "expected a token id, a list of up to 64 of them, or null");
    c.special_tokens[key] = v;
  }
  const char* dtype_key = r.has("dtype") ? "dtype" : "torch_dtype";
  const std::string dt = r.string_or(dtype_key, "float32");
  if (dt == "float32") c.dtype = DType::F32;
  else if (dt == "bfloat16") c.dtype = DType::BF16;
  else if (dt == "float16") c.dtype = DType::F16;
  else r.bad(dtype_key, "unsupported (float32, bfloat16, float16)");
  return c;
}

ModelConfig load_config(const std::filesystem::path& dir) {
  const std::filesystem::path file = dir / "config.json";
  return parse_config(parse_json(read_file(file), file.string()), file.string());
}

json config_to_json(const ModelConfig& c) {
  // nlohmann writes a non-finite double as null, which a reader takes for "absent" (the default).
  for (const auto& [key, v] : {std::pair<const char*, double>{"rms_norm_eps", c.rms_eps}, {"rope_theta", c.rope.theta},
                               {"factor", c.rope.factor}, {"low_freq_factor", c.rope.low_freq_factor},
                               {"high_freq_factor", c.rope.high_freq_factor}})
    RT_CHECK(std::isfinite(v), "config key '", key, "' = ", v, ": must be finite");
  json j;
  j["architectures"] = {arch_class_name(c.arch)};
  j["model_type"] = arch_model_type(c.arch);
  j["vocab_size"] = c.vocab;
  j["hidden_size"] = c.hidden;
  j["intermediate_size"] = c.ffn;
  j["num_hidden_layers"] = c.layers;
  j["num_attention_heads"] = c.heads;
  j["num_key_value_heads"] = c.kv_heads;
  j["head_dim"] = c.head_dim;
  j["max_position_embeddings"] = c.max_positions;
  j["rms_norm_eps"] = c.rms_eps;
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = c.tie_embeddings;
  if (c.arch != Arch::Qwen2 && c.arch != Arch::Mistral) j["attention_bias"] = c.o_bias;
  j["attention_dropout"] = 0.0;
  for (const auto& [key, value] : c.special_tokens.items()) j[key] = value;
  j["torch_dtype"] = c.dtype == DType::BF16 ? "bfloat16" : c.dtype == DType::F16 ? "float16" : "float32";
  // The legacy keys: transformers 4 reads them and transformers 5 converts them to rope_parameters.
  j["rope_theta"] = c.rope.theta;
  if (c.rope.llama3) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", c.rope.factor},
                         {"low_freq_factor", c.rope.low_freq_factor},
                         {"high_freq_factor", c.rope.high_freq_factor},
                         {"original_max_position_embeddings", c.rope.original_max_position}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  if (c.arch == Arch::Mistral) {
    RT_CHECK(c.full_attention_layers.empty(), "config: MistralForCausalLM windows every layer; it has no full ones");
    j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
  } else if (c.arch != Arch::Llama) {
    j["use_sliding_window"] = c.sliding_window > 0;
    j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
    if (c.sliding_window > 0) {
      // layer_types for transformers 5; max_window_layers (the leading full layers) for transformers 4 before
      // layer_types existed, exact when the full layers come first.
      json types = json::array();
      int64_t leading_full = 0;
      for (int64_t l = 0; l < c.layers; ++l) {
        const bool full = c.layer_window(l) == 0;
        types.push_back(full ? "full_attention" : "sliding_attention");
        if (full && leading_full == l) ++leading_full;
      }
      j["layer_types"] = std::move(types);
      j["max_window_layers"] = leading_full;
    }
  } else {
    RT_CHECK(c.sliding_window == 0, "config: LlamaForCausalLM has no sliding window (", c.sliding_window, ")");
  }
  return j;
}

void write_config(const std::filesystem::path& dir, const ModelConfig& c) {
  write_file_atomic(dir / "config.json", config_to_json(c).dump(2) + "\n");
}

int64_t ModelConfig::layer_window(int64_t layer) const {
  RT_CHECK(layer >= 0 && layer < layers, "config: layer ", layer, " of ", layers);
  RT_CHECK(full_attention_layers.empty() || static_cast<int64_t>(full_attention_layers.size()) == layers,
           "config: full_attention_layers lists ", full_attention_layers.size(), " layers of ", layers);
  if (sliding_window == 0 || (!full_attention_layers.empty() && full_attention_layers[static_cast<size_t>(layer)]))
    return 0;
  return sliding_window;
}

void check_sequence_supported(const ModelConfig& c, int64_t total_tokens) {
  RT_CHECK(total_tokens <= c.max_positions, "a sequence of ", total_tokens,
           " tokens is longer than config key 'max_position_embeddings' = ", c.max_positions);
}

void check_context_parallel_supported(const ModelConfig& c, int64_t total_tokens, int64_t cp, cp::CpComm comm,
                                      const CpSettingNames& names) {
  if (cp <= 1) return;
  const bool windowed = attention::masking_window(c.sliding_window, total_tokens) > 0;
  RT_CHECK(comm != cp::CpComm::AllToAll || (c.heads % cp == 0 && c.kv_heads % cp == 0), names.comm, " = a2a with ",
           names.cp, " = ", cp, ": the model's attention heads (", c.heads, ") and key/value heads (", c.kv_heads,
           ") must both be divisible by cp = ", cp, "; use ", names.comm, " = allgather",
           windowed ? " (ring takes no sliding window)" : " or ring");
  RT_CHECK(comm != cp::CpComm::Ring || !windowed, "config key 'sliding_window' = ", c.sliding_window,
           " is shorter than ", names.length, " (", total_tokens, " tokens), and ", names.comm, " = ring with ",
           names.cp, " = ", cp, " takes no sliding window: use ", names.comm, " = allgather or a2a, or ", names.cp,
           " = 1");
}

}  // namespace ringtrain::model
