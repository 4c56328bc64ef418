// Shared by the model tests: tiny random configurations of each architecture and the fixture folder.
#pragma once

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "ringtrain/model/hf_config.h"
#include "ringtrain/model/params.h"

namespace ringtrain::testing {

inline std::filesystem::path model_fixture_dir(const std::string& name) {
  return std::filesystem::path(RINGTRAIN_SOURCE_DIR) / "tests" / "fixtures" / "model" / name;
}

// A tiny model: hidden 16, 4 query heads / 2 kv heads of dim 4 (8 for Qwen3, different from hidden / heads),
// ffn 24, vocab 32, llama3 RoPE scaling on Llama.
inline model::ModelConfig tiny_config(model::Arch arch, bool tied = false, int64_t layers = 2) {
  model::ModelConfig c;
  c.arch = arch;
  c.vocab = 32, c.hidden = 16, c.layers = layers, c.heads = 4, c.kv_heads = 2, c.ffn = 24;
  c.head_dim = arch == model::Arch::Qwen3 ? 8 : 4;
  c.rms_eps = 1e-5;
  c.tie_embeddings = tied;
  c.qkv_bias = arch == model::Arch::Qwen2;
  c.qk_norm = arch == model::Arch::Qwen3;
  c.rope.theta = 10000.0;
  if (arch == model::Arch::Llama) {
    c.rope.llama3 = true;
    c.rope.factor = 8, c.rope.low_freq_factor = 1, c.rope.high_freq_factor = 4, c.rope.original_max_position = 8;
  }
  return c;
}

// Random weights with non-trivial norms and biases (so that their gradients matter).
inline std::vector<float> tiny_params(const model::ModelConfig& c, std::mt19937_64& rng) {
  const model::ParamLayout layout(c);
  std::vector<float> p(static_cast<size_t>(layout.total()));
  std::normal_distribution<float> n(0.f, 1.f);
  for (const model::ParamSpec& s : layout.specs()) {
    const bool norm = s.name.ends_with("norm.weight"), bias = s.name.ends_with(".bias");
    for (int64_t i = 0; i < s.numel; ++i)
      p[s.offset + i] = norm ? 1.f + 0.3f * n(rng) : bias ? 0.2f * n(rng) : 0.3f * n(rng);
  }
  return p;
}

inline std::vector<int32_t> random_ids(int64_t n, int64_t vocab, std::mt19937_64& rng) {
  std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& t : ids) t = d(rng);
  return ids;
}

}  // namespace ringtrain::testing
