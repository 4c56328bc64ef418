// `ringtrain bench generate`: batched generation with the GPU sampler on a causal LM with random weights
// (GpuModel::random, transformers' initialisation), random prompt tokens of one length; no stop token, so that every
// sequence decodes exactly new_tokens tokens, or with stop_ids the lowest ids as stop tokens, so that lengths vary
// as in RL rollouts (each draw ends a sequence with a probability of about stop_ids / vocab on a random model). Each
// run is one GpuSampler::generate(); its CUDA events split it into
// the prefill (prompts through the model and the LM head of their last rows) and the decoding (new_tokens draws and
// new_tokens - 1 one-row-per-sequence forwards, host round trips included). Warm-up runs first, then the medians of
// the timed runs.
//
// Decode tokens/s = (generated tokens - batch) / decode time (the tokens the decode forwards produce; the first of
// each sequence comes from the prefill's logits). Bytes per decoding step, the memory traffic a step cannot avoid:
// the bf16 matmul weights (embedding rows aside) and the keys and values the rows attend over (a running row its
// prompt and the tokens so far, a finished one a single key), averaged over the steps.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <random>
#include <vector>

#include "ringtrain/attention/selection.h"
#include "ringtrain/check/cuda/cuda_checks.h"
#include "ringtrain/check/device_checks.h"
#include "ringtrain/check/timing.h"
#include "ringtrain/core/error.h"
#include "ringtrain/model/cuda/gpu_model.h"
#include "ringtrain/model/cuda/gpu_sampler.h"
#include "ringtrain/model/flops.h"

namespace ringtrain::check::cuda {

nlohmann::json run_generate_bench(const GenerateBenchOptions& o) {
  check_generate_bench_sizes(o);
  model::ModelConfig c;
  c.arch = model::parse_arch(o.arch);
  c.layers = o.layers, c.hidden = o.hidden, c.heads = o.heads, c.kv_heads = o.kv_heads, c.head_dim = o.head_dim;
  c.ffn = o.ffn, c.vocab = o.vocab;
  c.tie_embeddings = true;
  c.qkv_bias = c.arch == model::Arch::Qwen2;
  c.qk_norm = c.arch == model::Arch::Qwen3;
  c.rope.theta = 500000.0;
  c.rms_eps = 1e-5;
  c.max_positions = kGenerateBenchMaxPositions;
  model::cuda::GpuModel m = model::cuda::GpuModel::random(c, o.seed, {}, 0);
  model::SamplerOptions so;
  so.max_cache_bytes = kGenerateBenchMaxCacheBytes;
  model::cuda::GpuSampler sampler(m, so);

  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(c.vocab - 1));
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(o.batch));
  for (auto& p : prompts) {
    p.resize(static_cast<size_t>(o.prompt));
    for (int32_t& t : p) t = token(rng);
  }
  std::vector<uint64_t> ids(static_cast<size_t>(o.batch));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = i;
  model::SamplingParams sp;
  sp.temperature = o.temperature, sp.top_k = o.top_k, sp.top_p = o.top_p, sp.max_new_tokens = o.new_tokens;
  for (int64_t t = 0; t < o.stop_ids; ++t) sp.stop_tokens.push_back(static_cast<int32_t>(t));

  std::vector<double> prefill, decode, decode_tokens, steps_run, kv_keys;
  attention::reset_dispatch_counts();
  for (int i = 0; i < o.warmup + o.iters; ++i) {
    sp.seed = o.seed + static_cast<uint64_t>(i);
    const std::vector<model::Generation> gens = sampler.generate(prompts, sp, ids);
    const double steps = static_cast<double>(sampler.timing().decode_steps);
    double generated = 0, keys = 0;
    for (const model::Generation& g : gens) {
      const double n = static_cast<double>(g.tokens.size()) - 1;  // decode steps this sequence ran in
      RT_CHECK(o.stop_ids > 0 || n + 1 == static_cast<double>(o.new_tokens), "bench generate: ", n + 1,
               " tokens generated for a prompt, expected ", o.new_tokens);
      generated += n + 1;
      keys += n * static_cast<double>(o.prompt) + n * (n + 1) / 2 + (steps - n);
    }
    if (i < o.warmup) continue;
    prefill.push_back(sampler.timing().prefill_ms);
    decode.push_back(sampler.timing().decode_ms);
    decode_tokens.push_back(generated - static_cast<double>(o.batch));
    steps_run.push_back(steps);
    kv_keys.push_back(steps > 0 ? keys / steps : 0);
  }
  const double prefill_ms = median(prefill), decode_ms = median(decode), steps = median(steps_run);
  const double weight_bytes = 2 * model::matmul_weights(c);
  const double kv_bytes = 2.0 * 2 * static_cast<double>(c.layers * c.kv_heads * c.head_dim) * median(kv_keys);
  const double step_ms = steps > 0 ? decode_ms / steps : 0;
  nlohmann::json r;
  r["gpu"] = gpu_name(0);
  r["arch"] = o.arch, r["layers"] = c.layers, r["hidden"] = c.hidden, r["heads"] = c.heads;
  r["kv_heads"] = c.kv_heads, r["head_dim"] = c.head_dim, r["ffn"] = c.ffn, r["vocab"] = c.vocab;
  r["batch"] = o.batch, r["prompt"] = o.prompt, r["new_tokens"] = o.new_tokens, r["stop_ids"] = o.stop_ids;
  r["decode_steps"] = steps, r["mean_new_tokens"] = median(decode_tokens) / static_cast<double>(o.batch) + 1;
  r["temperature"] = o.temperature, r["top_k"] = o.top_k, r["top_p"] = o.top_p;
  r["warmup"] = o.warmup, r["iters"] = o.iters;
  r["prefill_ms"] = prefill_ms, r["decode_ms"] = decode_ms, r["total_ms"] = prefill_ms + decode_ms;
  r["prefill_tokens_per_s"] = static_cast<double>(o.batch * o.prompt) / (prefill_ms / 1e3);
  r["decode_step_ms"] = step_ms;
  r["decode_tokens_per_s"] = median(decode_tokens) / (decode_ms / 1e3);
  r["generate_tokens_per_s"] =
      (median(decode_tokens) + static_cast<double>(o.batch)) / ((prefill_ms + decode_ms) / 1e3);
  r["step_weight_bytes"] = weight_bytes, r["step_kv_bytes"] = kv_bytes;
  r["step_gb_per_s"] = step_ms > 0 ? (weight_bytes + kv_bytes) / (step_ms / 1e3) / 1e9 : 0.0;
  r["attention_calls"] = attention::format_dispatch_counts(attention::dispatch_counts());
  return r;
}

}  // namespace ringtrain::check::cuda
