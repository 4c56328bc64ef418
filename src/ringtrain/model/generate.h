// Autoregressive generation on the CPU in fp32 with a KV cache, for every architecture the model runs (Llama,
// Qwen2, Qwen3, Mistral): the sampler of an RL run (rollouts whose logprobs the loss uses).
//
// One generate() call takes a batch of prompts of any lengths. Each prompt is prefilled alone (one forward over its
// tokens, writing its keys and values into the cache); then every step decodes one token for all sequences still
// running, as one batched forward of one row per sequence. The layers are model/'s own forward kernels
// (decoder_layer_forward); only attention differs: the new rows' keys and values are appended to the sequence's
// cache, and the rows attend to the whole cache through attention::forward with a bottom-right causal mask (Sq new
// rows against Skv = cached + new keys), so the attention selection picks the backend under the sampler's
// allow-list (on the CPU: flash, else math; both serve bottom-right masks at any Sq, Skv).
//
// Weights are read in place, never copied: a Sampler is a view of the trainer's weights, so the weights after a
// train step are what the next generate() uses (no file round trip, nothing to "refit"). The three ways to hand
// them over:
//   Sampler(config, params)  the flat host fp32 buffer in ParamLayout(config) order; kept alive by the caller.
//   Sampler(model)           a Model<float>'s params().
//   Sampler(policy)          a policy that decodes on its own device (Policy::make_device_sampler: the GPU policy,
//                            model/cuda/gpu_sampler.h, bf16 on the GPU with the policy's weights in place) hands
//                            generate() to that sampler. Otherwise a CPU fp32 Policy's weights() are read in place
//                            (its flat order is the layout's), and any other policy (fp64) through params() into a
//                            host fp32 copy at the start of every generate().
//
// Randomness is counter-based: the uniform that draws token t of a sequence is a hash of (seed, the sequence's
// sample id, t). The same seed and sample ids give the same tokens whatever the batch composition, its order or
// the number of threads (the fp32 forward of a row does not depend on the other rows of its batch). The GPU sampler
// keys its draws the same way (same seed and ids: same samples on the GPU), but its samples differ from the CPU's:
// its arithmetic is bf16, and it draws by Gumbel-max rather than by inverse CDF.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "ringtrain/attention/backend.h"
#include "ringtrain/core/stop_request.h"
#include "ringtrain/model/hf_config.h"
#include "ringtrain/model/model.h"
#include "ringtrain/model/params.h"
#include "ringtrain/model/policy.h"

namespace ringtrain::model {

struct SamplingParams {
  // The logits are divided by the temperature; 0 means greedy (the most likely token, the lowest id on a tie).
  double temperature = 1.0;
  // Keep the k most likely tokens and every token tied with the k-th (Hugging Face's top-k); 0 = all; 1 = greedy.
  int64_t top_k = 0;
  // Then keep the smallest most-likely set whose probability reaches top_p, with every token tied with the one that
  // crosses it; 1 = all.
  double top_p = 1.0;
  int64_t max_new_tokens = 16;
  // A sampled stop token ends its sequence; it is the last returned token (the policy learns to stop by scoring it).
  std::vector<int32_t> stop_tokens;
  uint64_t seed = 0;
};

struct SamplerOptions {
  // The sampler's attention allow-list (a BackendScope around its forwards); empty = every backend.
  std::vector<attention::BackendId> attention_backends;
  // Upper bound on the one KV-cache allocation of a generate() call; a larger request is an error before anything is
  // allocated. CPU: sum over prompts of (prompt + max_new_tokens - 1) × layers × kv_heads × head_dim × 2 × 4 bytes.
  // GPU: prompts × (longest prompt + max_new_tokens - 1) × layers × kv_heads × head_dim × 2 × 2 bytes (bf16, padded).
  int64_t max_cache_bytes = int64_t{4} << 30;
  // Checked before each prompt's prefill and each new token (not owned): generate() then throws comm::Interrupted.
  const StopRequest* stop = nullptr;
};
// Throws comm::Interrupted when `stop` is given and requested.
void stop_generation_if_requested(const StopRequest* stop);

enum class FinishReason : uint8_t { Stop, Length };

struct Generation {
  std::vector<int32_t> tokens;  // the new tokens, a stop token included
  // logprobs[i] = log π(tokens[i] | prompt, tokens[<i]) under the policy's own distribution: the softmax of the
  // logits BEFORE temperature, top-k and top-p. This is the `generation_logprobs` of the RL losses, what
  // Policy::score gives for the same tokens (up to fp32 rounding).
  std::vector<float> logprobs;
  // sampling_logprobs[i] = log q(tokens[i] | ...) under the distribution actually sampled from (temperature, top-k
  // and top-p applied, renormalised); 0 for greedy decoding. For importance corrections of the sampler itself.
  std::vector<float> sampling_logprobs;
  FinishReason finish = FinishReason::Length;
};

// One token drawn from a row of policy log-probabilities (a log-softmax over the vocabulary).
struct TokenChoice {
  int32_t token = -1;
  float logprob = 0.f;           // logprobs[token]
  float sampling_logprob = 0.f;  // under the processed distribution
};
// Applies temperature, then top-k, then top-p, and picks by inverse CDF over the kept tokens (most likely first,
// lower id first on ties) at `uniform` in [0, 1). Deterministic in its inputs.
TokenChoice choose_token(std::span<const float> logprobs, const SamplingParams& sampling, double uniform);
// The counter-based uniform in [0, 1) for token `step` of the sequence with id `sample_id`.
double sampling_uniform(uint64_t seed, uint64_t sample_id, int64_t step);

// A sampler that runs on a policy's own device (Policy::make_device_sampler). Sampler::generate checks the sampling
// parameters, prompts and sample ids before it calls generate(); sample_ids then has one id per prompt.
class DeviceSampler {
 public:
  virtual ~DeviceSampler() = default;
  virtual std::vector<Generation> generate(const std::vector<std::vector<int32_t>>& prompts,
                                           const SamplingParams& sampling, std::span<const uint64_t> sample_ids) = 0;
};

class Sampler {
 public:
  Sampler(ModelConfig config, const float* params, SamplerOptions options = {});
  explicit Sampler(Policy& policy, SamplerOptions options = {});

  const ModelConfig& config() const { return config_; }

  // Continues every prompt (not empty, ids in the vocabulary) by up to sampling.max_new_tokens tokens.
  // sample_ids[b] keys the randomness of prompt b (default: b); give the same prompt distinct ids to draw distinct
  // samples (GRPO's group), and a prompt the same id to reproduce its samples in another batch.
  std::vector<Generation> generate(const std::vector<std::vector<int32_t>>& prompts, const SamplingParams& sampling,
                                   std::span<const uint64_t> sample_ids = {});

 private:
  const float* weights();

  ModelConfig config_;
  ParamLayout layout_;
  SamplerOptions options_;
  std::vector<float> inv_freq_;
  const float* params_ = nullptr;  // in place (config/model constructors)
  Policy* policy_ = nullptr;       // else read from the policy at each generate()
  std::unique_ptr<DeviceSampler> device_;  // the policy's own sampler, when it has one
  std::vector<float> host_copy_;   // a non-fp32-CPU policy's weights, downloaded per generate()
};

}  // namespace ringtrain::model
