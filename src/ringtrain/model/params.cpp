#include "ringtrain/model/params.h"

#include <random>

#include "ringtrain/core/error.h"

namespace ringtrain::model {

int64_t ParamLayout::add(std::string name, std::vector<int64_t> shape) {
  ParamSpec s;
  s.name = std::move(name);
  s.shape = std::move(shape);
  s.numel = 1;
  for (int64_t d : s.shape) s.numel *= d;
  s.offset = total_;
  total_ += s.numel;
  specs_.push_back(std::move(s));
  return specs_.back().offset;
}

ParamLayout::ParamLayout(const ModelConfig& c) {
  const int64_t qd = c.heads * c.head_dim, kvd = c.kv_heads * c.head_dim;
  embed = add("model.embed_tokens.weight", {c.vocab, c.hidden});
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string p = cat("model.layers.", i, ".");
    LayerOffsets l;
    l.input_norm = add(p + "input_layernorm.weight", {c.hidden});
    l.q_w = add(p + "self_attn.q_proj.weight", {qd, c.hidden});
    if (c.qkv_bias) l.q_b = add(p + "self_attn.q_proj.bias", {qd});
    l.k_w = add(p + "self_attn.k_proj.weight", {kvd, c.hidden});
    if (c.qkv_bias) l.k_b = add(p + "self_attn.k_proj.bias", {kvd});
    l.v_w = add(p + "self_attn.v_proj.weight", {kvd, c.hidden});
    if (c.qkv_bias) l.v_b = add(p + "self_attn.v_proj.bias", {kvd});
    l.o_w = add(p + "self_attn.o_proj.weight", {c.hidden, qd});
    if (c.o_bias) l.o_b = add(p + "self_attn.o_proj.bias", {c.hidden});
    if (c.qk_norm) {
      l.q_norm = add(p + "self_attn.q_norm.weight", {c.head_dim});
      l.k_norm = add(p + "self_attn.k_norm.weight", {c.head_dim});
    }
    l.post_norm = add(p + "post_attention_layernorm.weight", {c.hidden});
    l.gate = add(p + "mlp.gate_proj.weight", {c.ffn, c.hidden});
    l.up = add(p + "mlp.up_proj.weight", {c.ffn, c.hidden});
    l.down = add(p + "mlp.down_proj.weight", {c.hidden, c.ffn});
    layers.push_back(l);
  }
  final_norm = add("model.norm.weight", {c.hidden});
  lm_head = c.tie_embeddings ? embed : add("lm_head.weight", {c.vocab, c.hidden});
}

const ParamSpec* ParamLayout::find(const std::string& name) const {
  for (const ParamSpec& s : specs_)
    if (s.name == name) return &s;
  return nullptr;
}

std::vector<float> params_from_tensors(const ParamLayout& layout, const ModelConfig& c, const TensorMap& tensors,
                                       const std::string& source) {
  std::vector<float> out(static_cast<size_t>(layout.total()));
  for (const ParamSpec& s : layout.specs()) {
    auto it = tensors.find(s.name);
    RT_CHECK(it != tensors.end(), source, ": missing tensor '", s.name, "' (expected shape ", shape_string(s.shape),
             ")");
    RT_CHECK(it->second.shape == s.shape, it->second.file, ": tensor '", s.name, "' has shape ",
             shape_string(it->second.shape), ", expected ", shape_string(s.shape), " from config.json");
    const std::vector<float> v = to_float32(s.name, it->second);
    std::copy(v.begin(), v.end(), out.begin() + s.offset);
  }
  for (const auto& [name, t] : tensors) {
    if (layout.find(name)) continue;
    const bool rope_cache = name.ends_with("rotary_emb.inv_freq");
    const bool tied_head = c.tie_embeddings && name == "lm_head.weight";
    RT_CHECK(rope_cache || tied_head, t.file, ": unexpected tensor '", name, "' ", shape_string(t.shape),
             " for a ", arch_class_name(c.arch), " with this config.json");
  }
  return out;
}

TensorMap params_to_tensors(const ParamLayout& layout, const float* values, DType dtype) {
  TensorMap out;
  for (const ParamSpec& s : layout.specs())
    out.emplace(s.name, from_float32(std::vector<float>(values + s.offset, values + s.offset + s.numel), s.shape, dtype));
  return out;
}

std::vector<float> random_params(const ParamLayout& layout, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 0.02f);
  std::vector<float> out(static_cast<size_t>(layout.total()));
  for (const ParamSpec& s : layout.specs()) {
    const bool is_norm = s.name.find("norm.weight") != std::string::npos;
    const bool is_bias = s.name.ends_with(".bias");
    for (int64_t i = 0; i < s.numel; ++i) out[s.offset + i] = is_norm ? 1.f : is_bias ? 0.f : normal(rng);
  }
  return out;
}

void save_checkpoint(const std::filesystem::path& dir, const ModelConfig& c, const std::vector<float>& values) {
  const ParamLayout layout(c);
  RT_CHECK(static_cast<int64_t>(values.size()) == layout.total(), "save_checkpoint: ", values.size(),
           " values for a model of ", layout.total(), " parameters");
  std::filesystem::create_directories(dir);
  write_safetensors(dir / "model.safetensors", params_to_tensors(layout, values.data(), c.dtype));
  write_config(dir, c);
}

std::vector<float> load_checkpoint_params(const std::filesystem::path& dir, const ModelConfig& c) {
  return params_from_tensors(ParamLayout(c), c, read_checkpoint_tensors(dir), dir.string());
}

}  // namespace ringtrain::model
