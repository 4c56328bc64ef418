#include "ringtrain/model/generate.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "ringtrain/attention/selection.h"
#include "ringtrain/comm/agreed.h"
#include "ringtrain/core/checked.h"
#include "ringtrain/core/error.h"
#include "ringtrain/core/hashed_normal.h"
#include "ringtrain/model/decoder_layer.h"
#include "ringtrain/model/layers.h"
#include "ringtrain/model/logprobs.h"

namespace ringtrain::model {
namespace {

// The keys and values of one generate() call in one allocation, [layers][k | v][slot][kv_heads * head_dim]:
// sequence b owns the slots [first_slot[b], first_slot[b] + capacity[b]), of which the first length[b] are filled.
struct KvCache {
  int64_t slots = 0, row = 0;
  std::vector<float> data;
  std::vector<int64_t> first_slot, capacity, length;

  float* at(int64_t layer, int kv, int64_t slot) { return data.data() + ((layer * 2 + kv) * slots + slot) * row; }
};

// The decoder layer's attention during generation: each sequence's new rows (S of them: its prompt in the prefill,
// one token per decode step) append their keys and values to the sequence's cache and attend to all its cached
// keys, bottom-right causal (row i of S sees cached + i + 1 keys; with the layer's window w only the last w of them,
// the query at position t seeing positions [t - w + 1, t]).
class CachedAttention final : public SequenceAttention {
 public:
  explicit CachedAttention(KvCache& cache) : cache_(cache) {}

  // The rows of the next layer forward belong to `sequences` (one entry per batch row of the forward).
  void start_layer(int64_t layer, const std::vector<int64_t>& sequences) { layer_ = layer, sequences_ = &sequences; }

  int64_t total_seqlen(int64_t local_seqlen) const override {
    int64_t longest = 0;
    for (int64_t s : *sequences_) longest = std::max(longest, cache_.length[s] + local_seqlen);
    return longest;
  }

  void forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
               const TensorView& lse, int64_t window) override {
    RT_CHECK(k.is_contiguous() && v.is_contiguous() && k.dtype == DType::F32,
             "generation: the cache takes contiguous fp32 keys and values");
    const int64_t batch = q.shape[0], S = q.shape[1], heads_kv = k.shape[2], dim = k.shape[3];
    const int64_t n = S * cache_.row;
    for (int64_t i = 0; i < batch; ++i) {
      const int64_t seq = (*sequences_)[static_cast<size_t>(i)], cached = cache_.length[seq];
      RT_CHECK(cached + S <= cache_.capacity[seq], "generation: sequence ", seq, " overflows its KV cache (",
               cached + S, " > ", cache_.capacity[seq], " slots)");
      float* keys = cache_.at(layer_, 0, cache_.first_slot[seq]);
      float* values = cache_.at(layer_, 1, cache_.first_slot[seq]);
      std::copy_n(k.ptr<float>() + i * n, n, keys + cached * cache_.row);
      std::copy_n(v.ptr<float>() + i * n, n, values + cached * cache_.row);
      attention::AttnForwardArgs a;
      a.q = q.slice(0, i, 1), a.o = o.slice(0, i, 1), a.lse = lse.slice(0, i, 1);
      a.k = contiguous_view(keys, DType::F32, Device::cpu(), {1, cached + S, heads_kv, dim});
      a.v = contiguous_view(values, DType::F32, Device::cpu(), {1, cached + S, heads_kv, dim});
      attention::AttnParams p = attention::params_for(a.q, a.k, attention::MaskType::CausalBottomRight);
      p.window = attention::masking_window(window, cached + S);
      attention::forward(p, a);
    }
  }

  void backward(const TensorView&, const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                const TensorView&, const TensorView&, const TensorView&, const TensorView&, int64_t) override {
    RT_CHECK(false, "generation: the KV-cache attention has no backward");
  }

 private:
  KvCache& cache_;
  int64_t layer_ = 0;
  const std::vector<int64_t>* sequences_ = nullptr;
};

// One forward of S new tokens for each of `sequences` (tokens and positions [sequences * S]); writes the
// logits of each sequence's last row into logits [sequences, vocab] and advances the cache lengths.
struct Decoder {
  const ModelConfig& config;
  const ParamLayout& layout;
  const std::vector<float>& inv_freq;
  const float* weights;
  KvCache& cache;

  void forward(const std::vector<int32_t>& tokens, const std::vector<int32_t>& positions,
               const std::vector<int64_t>& sequences, int64_t S, std::vector<float>& logits) {
    const int64_t batch = static_cast<int64_t>(sequences.size()), N = batch * S, H = config.hidden;
    CachedAttention attention(cache);
    std::vector<float> x(static_cast<size_t>(N * H));
    embedding_forward(x.data(), tokens.data(), weights + layout.embed, N, H, config.vocab);
    LayerActs<float> acts;
    for (int64_t l = 0; l < config.layers; ++l) {
      attention.start_layer(l, sequences);
      acts.x_in = std::move(x);
      x.assign(static_cast<size_t>(N * H), 0.f);
      const LayerCall call{&config, &layout.layers[l], positions.data(), batch, S, &inv_freq, &attention,
                           config.layer_window(l)};
      decoder_layer_forward(call, weights, acts, x.data());
    }
    for (int64_t s : sequences) cache.length[s] += S;
    // Only each sequence's last row is continued: its final norm and LM head.
    std::vector<float> last(static_cast<size_t>(batch * H)), hidden(last.size()), rstd(static_cast<size_t>(batch));
    for (int64_t b = 0; b < batch; ++b) std::copy_n(x.data() + ((b + 1) * S - 1) * H, H, last.data() + b * H);
    rmsnorm_forward(hidden.data(), rstd.data(), last.data(), weights + layout.final_norm, batch, H, config.rms_eps);
    logits.resize(static_cast<size_t>(batch * config.vocab));
    linear_forward(logits.data(), hidden.data(), weights + layout.lm_head, static_cast<const float*>(nullptr), batch,
                   H, config.vocab);
  }
};

void check_sampling(const SamplingParams& s, int64_t vocab) {
  RT_CHECK(std::isfinite(s.temperature) && s.temperature >= 0, "sampling: temperature ", s.temperature,
           " must be finite and >= 0 (0 = greedy)");
  RT_CHECK(s.top_k >= 0, "sampling: top_k ", s.top_k, " must be >= 0 (0 = all tokens)");
  RT_CHECK(s.top_p > 0 && s.top_p <= 1, "sampling: top_p ", s.top_p, " must be in (0, 1]");
  RT_CHECK(s.max_new_tokens > 0 && s.max_new_tokens < std::numeric_limits<int32_t>::max(), "sampling: max_new_tokens ",
           s.max_new_tokens, " must be positive and fit int32 positions");
  for (int32_t t : s.stop_tokens)
    RT_CHECK(t >= 0 && t < vocab, "sampling: stop token ", t, " is outside the vocabulary [0, ", vocab, ")");
}

bool more_likely(std::span<const float> lp, int32_t a, int32_t b) {
  return lp[a] > lp[b] || (lp[a] == lp[b] && a < b);
}

}  // namespace

void stop_generation_if_requested(const StopRequest* stop) {
  if (stop && stop->requested()) throw comm::Interrupted("generate was interrupted");
}

double sampling_uniform(uint64_t seed, uint64_t sample_id, int64_t step) {
  const uint64_t h = splitmix64(splitmix64(splitmix64(seed) ^ sample_id) ^ static_cast<uint64_t>(step));
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

TokenChoice choose_token(std::span<const float> lp, const SamplingParams& s, double uniform) {
  const int64_t vocab = static_cast<int64_t>(lp.size());
  RT_CHECK(vocab > 0, "sampling: empty distribution");
  RT_CHECK(uniform >= 0 && uniform < 1, "sampling: uniform ", uniform, " is outside [0, 1)");
  int32_t best = 0;
  for (int32_t v = 0; v < vocab; ++v) {
    RT_CHECK(!std::isnan(lp[v]), "sampling: the logprob of token ", v, " is NaN");
    if (more_likely(lp, v, best)) best = v;
  }
  RT_CHECK(std::isfinite(lp[best]), "sampling: the largest logprob is ", lp[best]);
  if (s.temperature == 0 || s.top_k == 1) return {best, lp[best], 0.f};

  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  const auto cmp = [&](int32_t a, int32_t b) { return more_likely(lp, a, b); };
  int64_t kept = vocab;
  if (s.top_k > 0 && s.top_k < vocab) {
    std::partial_sort(order.begin(), order.begin() + s.top_k, order.end(), cmp);
    // The tokens tied with the k-th follow it, lower id first (the k-th has the lowest id of them).
    const float kth = lp[order[static_cast<size_t>(s.top_k - 1)]];
    const auto tail = order.begin() + s.top_k;
    const auto tied_end = std::partition(tail, order.end(), [&](int32_t v) { return lp[v] == kth; });
    std::sort(tail, tied_end);
    kept = tied_end - order.begin();
  } else if (s.top_p < 1) {
    std::sort(order.begin(), order.end(), cmp);
  }
  // Unnormalised probabilities after temperature, relative to the most likely token (no overflow).
  std::vector<double> w(static_cast<size_t>(kept));
  for (int64_t i = 0; i < kept; ++i) w[i] = std::exp((static_cast<double>(lp[order[i]]) - lp[best]) / s.temperature);
  if (s.top_p < 1) {  // the most likely prefix whose mass reaches top_p (the token that crosses it included)
    const double total = std::accumulate(w.begin(), w.begin() + kept, 0.0);
    double mass = 0;
    int64_t n = 0;
    while (n < kept && mass < s.top_p * total) mass += w[n++];
    n = std::max<int64_t>(n, 1);
    while (n < kept && lp[order[n]] == lp[order[n - 1]]) ++n;
    kept = n;
  }
  const double z = std::accumulate(w.begin(), w.begin() + kept, 0.0);
  // Inverse CDF: the running sum reaches z (the same additions in the same order) > uniform * z.
  const double target = uniform * z;
  double acc = 0;
  int64_t pick = 0;
  for (; pick < kept - 1; ++pick) {
    acc += w[pick];
    if (acc > target) break;
  }
  while (w[pick] == 0 && pick > 0) --pick;  // uniform * z rounded up to z: never a token of probability 0
  const int32_t token = order[pick];
  return {token, lp[token], static_cast<float>(std::log(w[pick] / z))};
}

Sampler::Sampler(ModelConfig config, const float* params, SamplerOptions options)
    : config_(std::move(config)), layout_(config_), options_(std::move(options)),
      inv_freq_(rope_inv_freq(config_.rope, config_.head_dim)), params_(params) {
  RT_CHECK(params_ != nullptr, "sampler: no weights");
}

Sampler::Sampler(Policy& policy, SamplerOptions options)
    : config_(policy.config()), layout_(config_), options_(std::move(options)),
      inv_freq_(rope_inv_freq(config_.rope, config_.head_dim)), policy_(&policy),
      device_(policy.make_device_sampler(options_)) {}

const float* Sampler::weights() {
  if (params_) return params_;
  bool in_place = policy_->device().is_cpu() && policy_->dtype() == DType::F32;
  for (size_t i = 0; in_place && i < layout_.specs().size(); ++i)
    in_place = policy_->flat_offsets()[i] == layout_.specs()[i].offset;
  if (in_place) return static_cast<const float*>(policy_->weights().data);
  host_copy_ = policy_->params();
  return host_copy_.data();
}

std::vector<Generation> Sampler::generate(const std::vector<std::vector<int32_t>>& prompts,
                                          const SamplingParams& sampling, std::span<const uint64_t> sample_ids) {
  const int64_t vocab = config_.vocab, batch = static_cast<int64_t>(prompts.size());
  check_sampling(sampling, vocab);
  RT_CHECK(batch > 0, "generation: no prompts");
  RT_CHECK(sample_ids.empty() || static_cast<int64_t>(sample_ids.size()) == batch, "generation: ", sample_ids.size(),
           " sample ids for ", batch, " prompts");
  for (int64_t b = 0; b < batch; ++b) {
    const std::vector<int32_t>& p = prompts[static_cast<size_t>(b)];
    RT_CHECK(!p.empty(), "generation: prompt ", b, " is empty");
    for (size_t i = 0; i < p.size(); ++i)
      RT_CHECK(p[i] >= 0 && p[i] < vocab, "generation: prompt ", b, " token ", i, " = ", p[i],
               " is outside the vocabulary [0, ", vocab, ")");
  }
  if (device_) {
    std::vector<uint64_t> ids(sample_ids.begin(), sample_ids.end());
    if (ids.empty())
      for (int64_t b = 0; b < batch; ++b) ids.push_back(static_cast<uint64_t>(b));
    return device_->generate(prompts, sampling, ids);
  }

  KvCache cache;
  cache.row = config_.kv_heads * config_.head_dim;
  int64_t longest = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const std::vector<int32_t>& p = prompts[static_cast<size_t>(b)];
    // The last sampled token is never fed back: prompt + max_new - 1 slots.
    const int64_t capacity = static_cast<int64_t>(p.size()) + sampling.max_new_tokens - 1;
    RT_CHECK(capacity < std::numeric_limits<int32_t>::max(), "generation: prompt ", b, " (", p.size(),
             " tokens) + max_new_tokens ", sampling.max_new_tokens, " does not fit int32 positions");
    cache.first_slot.push_back(cache.slots);
    cache.capacity.push_back(capacity);
    cache.length.push_back(0);
    cache.slots += capacity;
    longest = std::max(longest, capacity + 1);
  }
  check_sequence_supported(config_, longest);
  const int64_t elements =
      checked_mul(checked_mul(checked_mul(cache.slots, cache.row, "generation: KV cache size"), 2, "generation: KV cache size"),
                  config_.layers, "generation: KV cache size");
  const int64_t bytes = checked_mul(elements, static_cast<int64_t>(sizeof(float)), "generation: KV cache size");
  RT_CHECK(bytes <= options_.max_cache_bytes, "generation: the KV cache of ", batch, " prompts (", cache.slots,
           " token slots) needs ", bytes, " bytes, more than max_cache_bytes = ", options_.max_cache_bytes);
  cache.data.assign(static_cast<size_t>(elements), 0.f);

  attention::BackendScope scope("sampler", ModelOptions{options_.attention_backends, {}}.allowed_backends());
  Decoder decoder{config_, layout_, inv_freq_, weights(), cache};

  // Prefill: each prompt alone; its last row's logits start its generation.
  std::vector<float> logits(static_cast<size_t>(batch * vocab)), one;
  for (int64_t b = 0; b < batch; ++b) {
    stop_generation_if_requested(options_.stop);
    const std::vector<int32_t>& p = prompts[static_cast<size_t>(b)];
    std::vector<int32_t> positions(p.size());
    std::iota(positions.begin(), positions.end(), 0);
    decoder.forward(p, positions, {b}, static_cast<int64_t>(p.size()), one);
    std::copy(one.begin(), one.end(), logits.begin() + b * vocab);
  }

  std::vector<Generation> out(static_cast<size_t>(batch));
  std::vector<int64_t> active(static_cast<size_t>(batch));
  std::iota(active.begin(), active.end(), 0);
  for (int64_t step = 0;; ++step) {
    stop_generation_if_requested(options_.stop);
    const int64_t n = static_cast<int64_t>(active.size());
    log_softmax_rows(logits.data(), n, vocab);
    std::vector<int64_t> running;
    std::vector<int32_t> tokens, positions;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t b = active[static_cast<size_t>(i)];
      const uint64_t id = sample_ids.empty() ? static_cast<uint64_t>(b) : sample_ids[static_cast<size_t>(b)];
      const std::span<const float> row(logits.data() + i * vocab, static_cast<size_t>(vocab));
      TokenChoice c;
      try {
        c = choose_token(row, sampling, sampling_uniform(sampling.seed, id, step));
      } catch (const Error& e) {
        throw Error(cat("generation: prompt ", b, ", new token ", step, ": ", e.what()));
      }
      Generation& g = out[static_cast<size_t>(b)];
      g.tokens.push_back(c.token);
      g.logprobs.push_back(c.logprob);
      g.sampling_logprobs.push_back(c.sampling_logprob);
      if (std::find(sampling.stop_tokens.begin(), sampling.stop_tokens.end(), c.token) != sampling.stop_tokens.end()) {
        g.finish = FinishReason::Stop;
      } else if (step + 1 < sampling.max_new_tokens) {
        running.push_back(b);
        tokens.push_back(c.token);
        positions.push_back(static_cast<int32_t>(cache.length[b]));
      }
    }
    if (running.empty()) break;
    active = std::move(running);
    decoder.forward(tokens, positions, active, 1, logits);
  }
  return out;
}

}  // namespace ringtrain::model
