// The model configuration read from a Hugging Face `config.json` (Llama, Qwen2, Qwen3, Mistral causal LMs)
// and written back in a form transformers loads. Anything the model cannot reproduce exactly is rejected
// with an error naming the key and its value.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ringtrain/core/dtype.h"
#include "ringtrain/cp/cp_attention.h"

namespace ringtrain::model {

enum class Arch : uint8_t { Llama, Qwen2, Qwen3, Mistral };
std::string arch_class_name(Arch a);  // "LlamaForCausalLM"
std::string arch_model_type(Arch a);  // "llama"
Arch parse_arch(const std::string& short_name);  // llama, qwen2, qwen3, mistral

struct RopeConfig {
  double theta = 10000.0;
  bool llama3 = false;  // rope_type "llama3": wavelength-dependent frequency scaling
  double factor = 1.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t original_max_position = 8192;
};

struct ModelConfig {
  Arch arch = Arch::Llama;
  int64_t vocab = 0, hidden = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, ffn = 0;
  int64_t max_positions = 4096;
  double rms_eps = 1e-6;
  RopeConfig rope;
  bool tie_embeddings = false;
  bool qkv_bias = false;  // Qwen2 always; Llama/Qwen3 with attention_bias
  bool o_bias = false;    // Llama/Qwen3 with attention_bias
  bool qk_norm = false;   // Qwen3: RMSNorm over head_dim on q and k before RoPE
  // The window of the windowed layers (a query sees its `sliding_window` most recent keys); 0 when no layer has one.
  int64_t sliding_window = 0;
  // Per layer, or empty for none: true where the layer attends to the whole sequence despite sliding_window
  // (Qwen2/Qwen3's "full_attention" layer_types). Mistral windows every layer.
  std::vector<bool> full_attention_layers;
  DType dtype = DType::F32;  // storage dtype of the checkpoint ("torch_dtype" / "dtype")
  // bos_token_id, eos_token_id and pad_token_id as the source gave them (each an id, a list of ids or null), kept
  // through checkpoints and exports, since transformers' generation stops at eos_token_id. Only the keys given.
  nlohmann::json special_tokens = nlohmann::json::object();

  // The sliding window of `layer` (0: it sees every earlier key).
  int64_t layer_window(int64_t layer) const;
};

// The files of a Hugging Face model folder beside config.json and the weights that its users need: generation
// settings, tokenizer, chat template. Checkpoints and exports carry them over.
const std::vector<std::string>& hf_companion_files();
// Those of a folder, by name, with their contents.
using CompanionFiles = std::vector<std::pair<std::string, std::string>>;
// The hf_companion_files() that `dir` holds; a link is followed (the Hugging Face cache links its files into blobs).
// An error names a companion's name that holds anything but a regular file, or a file above 1 GiB.
CompanionFiles read_hf_companion_files(const std::filesystem::path& dir);
// Each file written into `dir` through a temporary name and a rename.
void write_hf_companion_files(const std::filesystem::path& dir, const CompanionFiles& files);

// Parses and validates; `source` names the file in errors.
ModelConfig parse_config(const nlohmann::json& j, const std::string& source);
ModelConfig load_config(const std::filesystem::path& checkpoint_dir);
nlohmann::json config_to_json(const ModelConfig& c);
// Writes DIR/config.json through a temporary file and a rename.
void write_config(const std::filesystem::path& checkpoint_dir, const ModelConfig& c);

// Error unless the model can run a sequence of `total_tokens` exactly (within max_position_embeddings).
void check_sequence_supported(const ModelConfig& c, int64_t total_tokens);
// What the user calls the settings that check_context_parallel_supported names in its errors.
struct CpSettingNames {
  std::string cp = "parallel.cp", comm = "parallel.cp_comm", length = "policy.max_total_sequence_length";
};
// Error unless sequences of up to `total_tokens` can run under context parallelism over `cp` ranks moving KV by
// `comm`: all-to-all needs the heads and key/value heads divisible by cp; ring attention takes no sliding window, so
// with it a window shorter than the sequence is refused (one at least as long masks nothing). Each error names the
// model's values, the settings by `names` and what would run instead.
void check_context_parallel_supported(const ModelConfig& c, int64_t total_tokens, int64_t cp, cp::CpComm comm,
                                      const CpSettingNames& names = {});

}  // namespace ringtrain::model
