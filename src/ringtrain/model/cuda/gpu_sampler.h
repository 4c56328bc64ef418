// Generation on the GPU in bf16 (model/generate.h's DeviceSampler for a GPU policy): the GpuModel's own forward and
// weights, read in place (whatever the trainer wrote last is what the next generate() decodes with).
//
// One generate() call:
//  - one pooled KV cache, [layers][k | v][prompts][capacity][kv_heads][head_dim] bf16 with capacity = the longest
//    prompt + max_new_tokens - 1, checked against SamplerOptions::max_cache_bytes before it is allocated;
//  - prefill: the prompts packed back to back (up to kPrefillTokens tokens per forward, a longer prompt alone) through
//    GpuModel::forward with packed causal attention; each layer's keys and values are also copied into the cache.
//    The last row of each prompt goes through the LM head (fp32 logits);
//  - decoding: one forward of one row per prompt per step (GpuModel::forward_on_device, positions per row), whose
//    attention appends the row's key and value to its sequence's cache and attends over the cache through
//    attention::forward with a KV-cache call (AttnParams::kv_cache: the decode backend; when the allow-lists exclude
//    it, one ordinary bottom-right call per sequence on its used prefix, slower, with a warning that shows the
//    selection); a finished sequence rides along (its key and value go to a slot past its used prefix, never read)
//    until every sequence is done, so the step's shapes never change and its positions are known in advance, but
//    from the step after the host saw it finish it attends to one key instead of its whole cache;
//  - sampling on the GPU (sample_kernels.h): only the chosen tokens, their logprobs and a status come back per step,
//    read by the host while the device already runs the next step (fed from the drawn tokens on the device).
// Everything runs inside BackendScope("sampler", options.attention_backends) and the model's own scope.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ringtrain/model/cuda/gpu_model.h"
#include "ringtrain/model/generate.h"

namespace ringtrain::model::cuda {

// Prompt tokens per prefill forward.
constexpr int64_t kPrefillTokens = 16384;

// Where the last generate() spent its time (CUDA events on the model's stream).
struct GenerateTiming {
  double prefill_ms = 0;  // prefill forwards and their LM head, up to the first draw
  double decode_ms = 0;   // every draw and decoding step after that, host round trips included
  int64_t prompt_tokens = 0, decode_steps = 0;
};

class GpuSampler final : public DeviceSampler {
 public:
  // A view of the model: it must outlive the sampler.
  GpuSampler(GpuModel& model, SamplerOptions options);
  ~GpuSampler() override;
  // Prompts and sampling parameters as Sampler::generate checks them (sample_ids: one per prompt).
  std::vector<Generation> generate(const std::vector<std::vector<int32_t>>& prompts, const SamplingParams& sampling,
                                   std::span<const uint64_t> sample_ids) override;
  const GenerateTiming& timing() const { return timing_; }

 private:
  GpuModel& model_;
  SamplerOptions options_;
  GenerateTiming timing_;
  void* events_[5] = {};  // cudaEvent_t: start, end of prefill, end, two steps' downloads
};

}  // namespace ringtrain::model::cuda
