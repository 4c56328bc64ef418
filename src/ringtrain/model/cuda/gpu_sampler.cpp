#include "ringtrain/model/cuda/gpu_sampler.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>

#include "ringtrain/attention/selection.h"
#include "ringtrain/core/checked.h"
#include "ringtrain/core/cuda/check.h"
#include "ringtrain/core/error.h"
#include "ringtrain/core/log.h"
#include "ringtrain/model/cuda/sample_kernels.h"
#include "ringtrain/model/sequence_attention.h"

namespace ringtrain::model::cuda {
namespace {

// The keys (kv = 0) and values (kv = 1) of every layer: layer l's keys are [prompts, capacity, row] bf16 with
// row = kv_heads * head_dim; prompt b owns the cache rows [b * capacity, (b + 1) * capacity).
struct DeviceCache {
  Tensor data;
  int64_t prompts = 0, capacity = 0, row = 0;
  bf16* at(int64_t layer, int kv) const { return data.ptr<bf16>() + (layer * 2 + kv) * prompts * capacity * row; }
};

// Page-locked host memory, for downloads that the host reads while the device works on.
struct PinnedBuffer {
  explicit PinnedBuffer(size_t bytes) {
    RT_CUDA_CHECK(cudaMallocHost(&ptr, bytes), "allocating ", bytes, " bytes of pinned host memory");
  }
  ~PinnedBuffer() { cudaFreeHost(ptr); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  void* ptr = nullptr;
};

Tensor upload_i32(const std::vector<int32_t>& host, Device device) {
  const int64_t n = static_cast<int64_t>(host.size());
  Tensor t = Tensor::empty({n}, DType::I32, device);
  copy(t, contiguous_view(const_cast<int32_t*>(host.data()), DType::I32, Device::cpu(), {n}));
  return t;
}

// Prefill: the packed prompts' keys and values go to their cache rows (rows[t] for packed row t), then causal
// attention within each prompt (packed, THD).
class PrefillAttention final : public SequenceAttention {
 public:
  PrefillAttention(const DeviceCache& cache, const int32_t* rows, std::vector<int64_t> prompt_lens)
      : cache_(cache), rows_(rows), packed_(make_packed_attention(std::move(prompt_lens))) {}
  int64_t total_seqlen(int64_t local_seqlen) const override { return packed_->total_seqlen(local_seqlen); }
  void forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
               const TensorView& lse, int64_t window) override {
    const int64_t n = k.shape[0] * k.shape[1];
    copy_rows(nullptr, cache_.at(layer_, 0), rows_, k.ptr<bf16>(), nullptr, n, cache_.row);
    copy_rows(nullptr, cache_.at(layer_, 1), rows_, v.ptr<bf16>(), nullptr, n, cache_.row);
    ++layer_;
    packed_->forward(q, k, v, o, lse, window);
  }
  void backward(const TensorView&, const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                const TensorView&, const TensorView&, const TensorView&, const TensorView&, int64_t) override {
    RT_CHECK(false, "generation: the KV-cache attention has no backward");
  }

 private:
  const DeviceCache& cache_;
  const int32_t* rows_;
  std::unique_ptr<SequenceAttention> packed_;
  int64_t layer_ = 0;
};

// A decoding step: row b's key and value go to cache row slots[b], then row b attends to the first used[b] keys of
// its prompt's cache (the last `window` of them under the layer's sliding window): one KV-cache call (bottom-right
// causal) when a backend under the scopes serves it (decode), else one ordinary call per sequence on its used prefix
// (an allow-list without decode: slower, and said once).
class DecodeAttention final : public SequenceAttention {
 public:
  DecodeAttention(const DeviceCache& cache, const int32_t* slots, const int32_t* used, const int32_t* used_host)
      : cache_(cache), slots_(slots), used_(used), used_host_(used_host) {}
  void start_step() { layer_ = 0; }
  int64_t total_seqlen(int64_t) const override { return cache_.capacity; }
  void forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
               const TensorView& lse, int64_t window) override {
    const int64_t B = q.shape[0], heads_kv = k.shape[2], dim = k.shape[3];
    copy_rows(nullptr, cache_.at(layer_, 0), slots_, k.ptr<bf16>(), nullptr, B, cache_.row);
    copy_rows(nullptr, cache_.at(layer_, 1), slots_, v.ptr<bf16>(), nullptr, B, cache_.row);
    attention::AttnForwardArgs a;
    a.q = q, a.o = o, a.lse = lse;
    a.k = contiguous_view(cache_.at(layer_, 0), DType::BF16, q.device, {B, cache_.capacity, heads_kv, dim});
    a.v = contiguous_view(cache_.at(layer_, 1), DType::BF16, q.device, {B, cache_.capacity, heads_kv, dim});
    a.kv_used = contiguous_view(const_cast<int32_t*>(used_), DType::I32, q.device, {B});
    attention::AttnParams p = attention::params_for(a.q, a.k, attention::MaskType::CausalBottomRight);
    p.kv_cache = true;
    p.window = attention::masking_window(window, cache_.capacity);
    // The same for every step of the call and for every layer with the same window (a model has one window, on some
    // layers or all): decided once per window or none.
    int& cache_calls = cache_calls_[p.window > 0];
    if (cache_calls < 0) {
      const attention::Selection s = attention::explain(p);
      cache_calls = s.backend != nullptr;
      if (!cache_calls)
        RT_LOG(Warn, "generation: attending per sequence, since no backend serves KV-cache calls\n", s.report());
    }
    if (cache_calls) {
      attention::forward(p, a);
    } else {
      for (int64_t b = 0; b < B; ++b) {
        const int64_t offset = b * cache_.capacity * cache_.row, n = used_host_[b];
        attention::AttnForwardArgs one;
        one.q = q.slice(0, b, 1), one.o = o.slice(0, b, 1), one.lse = lse.slice(0, b, 1);
        one.k = contiguous_view(cache_.at(layer_, 0) + offset, DType::BF16, q.device, {1, n, heads_kv, dim});
        one.v = contiguous_view(cache_.at(layer_, 1) + offset, DType::BF16, q.device, {1, n, heads_kv, dim});
        attention::AttnParams one_p = attention::params_for(one.q, one.k, attention::MaskType::CausalBottomRight);
        one_p.window = attention::masking_window(window, n);
        attention::forward(one_p, one);
      }
    }
    ++layer_;
  }
  void backward(const TensorView&, const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                const TensorView&, const TensorView&, const TensorView&, const TensorView&, int64_t) override {
    RT_CHECK(false, "generation: the KV-cache attention has no backward");
  }

 private:
  const DeviceCache& cache_;
  const int32_t *slots_, *used_, *used_host_;
  int64_t layer_ = 0;
  int cache_calls_[2] = {-1, -1};  // whether a backend serves the KV-cache calls without / with a window (-1: unasked)
};

}  // namespace

GpuSampler::GpuSampler(GpuModel& model, SamplerOptions options) : model_(model), options_(std::move(options)) {
  RT_CUDA_CHECK(cudaSetDevice(model_.device().index), "selecting the sampler's GPU");
  for (void*& e : events_) {
    cudaEvent_t ev = nullptr;
    RT_CUDA_CHECK(cudaEventCreate(&ev), "creating the sampler's CUDA events");
    e = ev;
  }
}

GpuSampler::~GpuSampler() {
  for (void* e : events_)
    if (e) cudaEventDestroy(static_cast<cudaEvent_t>(e));
}

std::vector<Generation> GpuSampler::generate(const std::vector<std::vector<int32_t>>& prompts,
                                             const SamplingParams& sampling, std::span<const uint64_t> sample_ids) {
  const ModelConfig& c = model_.config();
  const Device dev = model_.device();
  RT_CUDA_CHECK(cudaSetDevice(dev.index), "selecting the sampler's GPU");
  const int64_t B = static_cast<int64_t>(prompts.size()), V = c.vocab, H = c.hidden;
  RT_CHECK(static_cast<int64_t>(sample_ids.size()) == B, "generation: ", sample_ids.size(), " sample ids for ", B,
           " prompts");
  int64_t longest = 0, prompt_tokens = 0;
  for (const std::vector<int32_t>& p : prompts) {
    longest = std::max<int64_t>(longest, static_cast<int64_t>(p.size()));
    prompt_tokens += static_cast<int64_t>(p.size());
  }
  // The last sampled token is never fed back: the longest prompt + max_new_tokens - 1 slots per prompt.
  const int64_t capacity = longest + sampling.max_new_tokens - 1;
  RT_CHECK(capacity < std::numeric_limits<int32_t>::max(), "generation: the longest prompt (", longest,
           " tokens) + max_new_tokens ", sampling.max_new_tokens, " does not fit int32 positions");
  check_sequence_supported(c, capacity + 1);
  const std::string what = "generation: the GPU KV cache size";
  DeviceCache cache;
  cache.prompts = B, cache.capacity = capacity, cache.row = c.kv_heads * c.head_dim;
  const int64_t elements =
      checked_mul(checked_mul(checked_mul(checked_mul(B, capacity, what), cache.row, what), 2, what), c.layers, what);
  const int64_t bytes = checked_mul(elements, 2, what);
  RT_CHECK(bytes <= options_.max_cache_bytes, "generation: the KV cache of ", B, " prompts x ", capacity,
           " slots (bf16, ", c.layers, " layers x ", c.kv_heads, " kv heads x ", c.head_dim, " dims, keys and values) ",
           "needs ", bytes, " bytes, more than max_cache_bytes = ", options_.max_cache_bytes);
  RT_CHECK(B * capacity < std::numeric_limits<int32_t>::max(), "generation: ", B, " prompts x ", capacity,
           " cache slots do not fit int32 row indices");
  cache.data = Tensor::empty({elements}, DType::BF16, dev);

  attention::BackendScope scope("sampler", ModelOptions{options_.attention_backends, {}}.allowed_backends());
  const cudaStream_t st = model_.stream();
  Gemm& gemm = model_.gemm();
  const auto ev = [&](int i) { return static_cast<cudaEvent_t>(events_[i]); };
  timing_ = GenerateTiming{};
  timing_.prompt_tokens = prompt_tokens;

  const Tensor logits = Tensor::empty({B, V}, DType::F32, dev);
  const Tensor ids = Tensor::empty({B}, DType::I64, dev);
  copy(ids, contiguous_view(const_cast<uint64_t*>(sample_ids.data()), DType::I64, Device::cpu(), {B}));
  const Tensor drawn = Tensor::empty({4 * B}, DType::I32, dev);  // token, logprob, sampling logprob, status
  const Tensor last_rows = Tensor::empty({B, H}, DType::BF16, dev);
  RT_CUDA_CHECK(cudaEventRecord(ev(0), st), "recording the sampler's start");

  // A stop leaves once the queued work is done: it reads buffers that go when this call returns.
  const auto stop_if_requested = [&] {
    if (!options_.stop || !options_.stop->requested()) return;
    RT_CUDA_CHECK(cudaStreamSynchronize(st), "finishing the sampler's work");
    stop_generation_if_requested(options_.stop);
  };

  // Prefill, prompts [b0, b1) per forward.
  for (int64_t b0 = 0; b0 < B;) {
    stop_if_requested();
    int64_t b1 = b0, tokens = 0;
    while (b1 < B && (b1 == b0 || tokens + static_cast<int64_t>(prompts[static_cast<size_t>(b1)].size()) <=
                                      kPrefillTokens))
      tokens += static_cast<int64_t>(prompts[static_cast<size_t>(b1++)].size());
    std::vector<int32_t> ids_in, positions, index;  // index: cache rows of the packed rows, then each prompt's last
    std::vector<int64_t> lens;
    for (int64_t b = b0; b < b1; ++b) {
      const std::vector<int32_t>& p = prompts[static_cast<size_t>(b)];
      for (size_t i = 0; i < p.size(); ++i) {
        ids_in.push_back(p[i]);
        positions.push_back(static_cast<int32_t>(i));
        index.push_back(static_cast<int32_t>(b * capacity + static_cast<int64_t>(i)));
      }
      lens.push_back(static_cast<int64_t>(p.size()));
    }
    for (int64_t b = b0, end = 0; b < b1; ++b) {
      end += lens[static_cast<size_t>(b - b0)];
      index.push_back(static_cast<int32_t>(end - 1));
    }
    const Tensor index_dev = upload_i32(index, dev);
    PrefillAttention attention(cache, index_dev.ptr<int32_t>(), lens);
    const bf16* hidden = model_.forward(ids_in.data(), positions.data(), 1, tokens, attention, false);
    copy_rows(st, last_rows.ptr<bf16>(), nullptr, hidden, index_dev.ptr<int32_t>() + tokens, b1 - b0, H);
    gemm.linear_forward_f32(logits.ptr<float>() + b0 * V, last_rows.ptr<bf16>(), model_.lm_head(), b1 - b0, H, V);
    b0 = b1;
  }
  RT_CUDA_CHECK(cudaEventRecord(ev(1), st), "recording the end of the prefill");

  // Decoding. Step s draws token s of every row, queues its download, then queues the forward of step s + 1 (fed
  // from the drawn tokens on the device) before it reads the draws: the GPU never waits for the host. Every row
  // advances each step, so the shapes never change; a finished row's key and value go to a slot past its used prefix,
  // never read, and from the step after the host saw it finish (finished_dev) it attends to one key, not its cache.
  std::vector<Generation> out(static_cast<size_t>(B));
  std::vector<uint8_t> done(static_cast<size_t>(B), 0);
  std::vector<int32_t> prompt_len(static_cast<size_t>(B)), used(static_cast<size_t>(B));
  for (size_t b = 0; b < prompts.size(); ++b) prompt_len[b] = static_cast<int32_t>(prompts[b].size());
  const Tensor prompt_len_dev = upload_i32(prompt_len, dev);
  const Tensor rows = Tensor::empty({3 * B}, DType::I32, dev);  // positions, cache rows, used lengths
  int32_t* const d_positions = rows.ptr<int32_t>();
  DecodeAttention attention(cache, d_positions + B, d_positions + 2 * B, used.data());
  const PinnedBuffer drawn_host(static_cast<size_t>(2 * 4 * B) * sizeof(int32_t));  // two steps' draws
  // The rows seen finished, uploaded after the host's read of step s and so before step s + 2's rows are laid out;
  // the host writes it again only after the next step's wait, which comes after that upload in stream order.
  const Tensor finished_dev = Tensor::zeros({B}, DType::I32, dev);
  const PinnedBuffer finished_host(static_cast<size_t>(B) * sizeof(int32_t));
  int32_t* const finished = static_cast<int32_t*>(finished_host.ptr);
  std::fill(finished, finished + B, 0);
  SampleArgs a;
  a.logits = logits.ptr<float>(), a.rows = B, a.vocab = V;
  a.temperature = static_cast<float>(sampling.temperature), a.top_k = sampling.top_k;
  a.top_p = static_cast<float>(sampling.top_p), a.seed = sampling.seed;
  a.sample_ids = reinterpret_cast<const uint64_t*>(ids.ptr<int64_t>());
  a.token = drawn.ptr<int32_t>(), a.logprob = reinterpret_cast<float*>(drawn.ptr<int32_t>() + B);
  a.sampling_logprob = reinterpret_cast<float*>(drawn.ptr<int32_t>() + 2 * B), a.status = drawn.ptr<int32_t>() + 3 * B;
  for (int64_t step = 0;; ++step) {
    stop_if_requested();
    a.step = step;
    sample_rows(st, a);
    const int32_t* host = static_cast<const int32_t*>(drawn_host.ptr) + (step % 2) * 4 * B;
    const cudaEvent_t copied = ev(3 + static_cast<int>(step % 2));
    const size_t bytes = static_cast<size_t>(4 * B) * sizeof(int32_t);
    RT_CUDA_CHECK(cudaMemcpyAsync(const_cast<int32_t*>(host), drawn.data(), bytes, cudaMemcpyDeviceToHost, st),
                  "downloading the draws");
    RT_CUDA_CHECK(cudaEventRecord(copied, st), "recording the draws' download");
    if (step + 1 < sampling.max_new_tokens) {
      decode_step_rows(st, d_positions, d_positions + B, d_positions + 2 * B, prompt_len_dev.ptr<int32_t>(),
                       finished_dev.ptr<int32_t>(), B, step, capacity);
      for (int64_t b = 0; b < B; ++b)
        used[static_cast<size_t>(b)] =
            finished[b] ? 1 : prompt_len[static_cast<size_t>(b)] + static_cast<int32_t>(step) + 1;
      attention.start_step();
      const bf16* hidden = model_.forward_on_device(drawn.ptr<int32_t>(), d_positions, B, 1, attention);
      gemm.linear_forward_f32(logits.ptr<float>(), hidden, model_.lm_head(), B, H, V);
      ++timing_.decode_steps;
    }
    RT_CUDA_CHECK(cudaEventSynchronize(copied), "waiting for the draws");
    bool running = false, newly_finished = false;
    for (int64_t b = 0; b < B; ++b) {
      const size_t i = static_cast<size_t>(b);
      if (done[i]) continue;
      const int32_t status = host[3 * B + b];
      RT_CHECK(status == 0, "generation: prompt ", b, ", new token ", step, ": ",
               status == 1 ? "a logit is NaN" : "no logit is finite");
      const int32_t token = host[b];
      float lp = 0, slp = 0;
      std::memcpy(&lp, &host[B + b], sizeof lp);
      std::memcpy(&slp, &host[2 * B + b], sizeof slp);
      Generation& g = out[i];
      g.tokens.push_back(token), g.logprobs.push_back(lp), g.sampling_logprobs.push_back(slp);
      if (std::find(sampling.stop_tokens.begin(), sampling.stop_tokens.end(), token) != sampling.stop_tokens.end()) {
        g.finish = FinishReason::Stop, done[i] = 1;
        finished[b] = 1, newly_finished = true;
      } else if (step + 1 >= sampling.max_new_tokens) {
        done[i] = 1;
      } else {
        running = true;
      }
    }
    if (!running) break;
    if (newly_finished)
      RT_CUDA_CHECK(cudaMemcpyAsync(finished_dev.data(), finished, static_cast<size_t>(B) * sizeof(int32_t),
                                    cudaMemcpyHostToDevice, st),
                    "uploading the finished rows");
  }
  RT_CUDA_CHECK(cudaEventRecord(ev(2), st), "recording the sampler's end");
  RT_CUDA_CHECK(cudaEventSynchronize(ev(2)), "waiting for the sampler");
  float ms = 0;
  RT_CUDA_CHECK(cudaEventElapsedTime(&ms, ev(0), ev(1)), "timing the prefill");
  timing_.prefill_ms = ms;
  RT_CUDA_CHECK(cudaEventElapsedTime(&ms, ev(1), ev(2)), "timing the decoding");
  timing_.decode_ms = ms;
  return out;
}

}  // namespace ringtrain::model::cuda
