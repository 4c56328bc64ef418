// Where each weight lives: every parameter of a model is one slice of a single flat buffer (values, and a
// gradient buffer of the same layout), named with its Hugging Face name and shape.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "ringtrain/model/hf_config.h"
#include "ringtrain/model/safetensors.h"

namespace ringtrain::model {

struct ParamSpec {
  std::string name;  // "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;
  int64_t offset = 0, numel = 0;
};

// Offsets of one decoder layer's weights in the flat buffer; -1 where the architecture has none.
struct LayerOffsets {
  int64_t input_norm = -1, q_w = -1, q_b = -1, k_w = -1, k_b = -1, v_w = -1, v_b = -1, o_w = -1, o_b = -1;
  int64_t q_norm = -1, k_norm = -1, post_norm = -1, gate = -1, up = -1, down = -1;
};

class ParamLayout {
 public:
  explicit ParamLayout(const ModelConfig& c);
  const std::vector<ParamSpec>& specs() const { return specs_; }
  int64_t total() const { return total_; }
  const ParamSpec* find(const std::string& name) const;

  int64_t embed = -1, final_norm = -1, lm_head = -1;  // lm_head == embed when the embeddings are tied
  std::vector<LayerOffsets> layers;

 private:
  int64_t add(std::string name, std::vector<int64_t> shape);
  std::vector<ParamSpec> specs_;
  int64_t total_ = 0;
};

// base + offset, or nullptr for an absent weight (offset -1).
template <typename T>
T* param_at(T* base, int64_t offset) {
  return offset < 0 ? nullptr : base + offset;
}

// Fills the flat buffer from checkpoint tensors (any float dtype). Errors name `source`, the tensor and the
// expected/actual shape; a tensor the model does not use is an error too (except RoPE caches, and lm_head.weight
// of a tied model, which transformers ignores).
std::vector<float> params_from_tensors(const ParamLayout& layout, const ModelConfig& c, const TensorMap& tensors,
                                       const std::string& source);
TensorMap params_to_tensors(const ParamLayout& layout, const float* values, DType dtype);
// The initialisation of transformers' causal LMs: N(0, 0.02) matrices, unit norms, zero biases.
std::vector<float> random_params(const ParamLayout& layout, uint64_t seed);

// What save_checkpoint does when `dir` already holds a checkpoint.
enum class ExistingCheckpoint : uint8_t {
  Refuse,   // an error naming the folder
  Replace,  // its files are replaced; a stale shard index and the shards it names are removed
};
// config.json + model.safetensors, written into a staging folder next to `dir` and then renamed into place, so a
// failure (a full disk) leaves the old checkpoint or none. Other files in `dir` (tokenizer, ...) are kept.
void save_checkpoint(const std::filesystem::path& dir, const ModelConfig& c, const std::vector<float>& values,
                     ExistingCheckpoint existing = ExistingCheckpoint::Replace);
std::vector<float> load_checkpoint_params(const std::filesystem::path& dir, const ModelConfig& c);

}  // namespace ringtrain::model
