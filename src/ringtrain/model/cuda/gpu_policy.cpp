// The GPU model as a Policy: bf16 weights, fp32 gradients and LM head, one microbatch as one padded or packed
// forward (BatchRows, as the CPU policy), context parallelism over the NCCL communicator of PolicyOptions.
#include "ringtrain/core/device_ops.h"
#include "ringtrain/core/error.h"
#include "ringtrain/model/batch_rows.h"
#include "ringtrain/model/cuda/gpu_logprobs.h"
#include "ringtrain/model/cuda/gpu_sampler.h"
#include "ringtrain/model/cuda/token_rows.h"
#include "ringtrain/model/gpu_policy.h"

namespace ringtrain::model {
namespace {

// The GPU the model goes on, once the options are known to be for one (checked before the weights are uploaded).
int checked_gpu(const PolicyOptions& options) {
  RT_CHECK(options.device.is_cuda(), "policy: no model for device ", device_name(options.device));
  RT_CHECK(options.dtype == DType::BF16, "policy: the GPU model computes in bf16, not ", dtype_name(options.dtype));
  RT_CHECK(options.logprob_chunk >= 0, "policy: LM-head chunk ", options.logprob_chunk, " must not be negative");
  return options.device.index;
}

class GpuPolicy final : public Policy, public DeviceRowsTraining {
  // One forward's rows, attention and results on the device: this rank's logprobs (then entropy) in `local`.
  struct Scoring {
    std::unique_ptr<BatchRows> rows;
    std::unique_ptr<SequenceAttention> attention;
    int64_t n = 0;
    Tensor targets, local;
    const cuda::bf16* hidden = nullptr;
  };

 public:
  GpuPolicy(const ModelConfig& config, const std::vector<float>& params, const PolicyOptions& options)
      : model_(config, params, options.model, checked_gpu(options)),
        chunk_(options.logprob_chunk > 0 ? options.logprob_chunk : cuda::default_logprob_chunk(config.vocab)),
        group_(options.cp_group && options.cp_group->size() > 1 ? options.cp_group : nullptr), cp_(options.cp) {
    RT_CHECK(!group_ || group_->device() == options.device, "policy: the cp group runs on ",
             device_name(group_->device()), ", the model on ", device_name(options.device));
    offsets_ = model_.dev_layout().device_offsets();
  }

  const ModelConfig& config() const override { return model_.config(); }
  const ParamLayout& layout() const override { return model_.layout(); }
  Device device() const override { return model_.device(); }
  DType dtype() const override { return DType::BF16; }

  TokenScores score(const TokenBatch& batch, bool for_backward, bool with_entropy) override {
    Scoring s = begin(batch, for_backward, with_entropy);
    cuda::token_logprobs(model_.gemm(), s.local.ptr<float>(), s.hidden, model_.lm_head(), s.targets.ptr<int32_t>(),
                         s.n, model_.config().hidden, model_.config().vocab, chunk_,
                         with_entropy ? s.local.ptr<float>() + s.n : nullptr);
    TokenScores scores = gather(s, with_entropy);
    if (for_backward) scored_ = std::move(s.rows), attention_ = std::move(s.attention);
    return scores;
  }

  TokenScores score_and_backward(const TokenBatch& batch, const TokenGradient& grad, bool with_entropy) override {
    Scoring s = begin(batch, /*for_backward=*/true, with_entropy);
    const ModelConfig& c = model_.config();
    const std::vector<BatchRows::ScoredToken> scored = s.rows->scored_tokens();
    const cuda::ChunkGradient chunk_grad = [&](int64_t first, std::span<const float> lp, std::span<float> d) {
      for (size_t i = 0; i < lp.size(); ++i) {
        const BatchRows::ScoredToken t = scored[static_cast<size_t>(first) + i];
        d[i] = t.pos < 0 ? 0.f : static_cast<float>(grad(t.seq, t.pos, lp[i]));
      }
    };
    const Tensor d_hidden = Tensor::empty({s.n, c.hidden}, DType::BF16, model_.device());
    cuda::token_logprobs_and_backward(model_.gemm(), s.local.ptr<float>(),
                                      with_entropy ? s.local.ptr<float>() + s.n : nullptr, d_hidden.ptr<cuda::bf16>(),
                                      model_.lm_head_grad(), chunk_grad, s.hidden, model_.lm_head(),
                                      s.targets.ptr<int32_t>(), s.n, c.hidden, c.vocab, chunk_);
    model_.backward(d_hidden.ptr<cuda::bf16>(), *s.attention);
    return gather(s, with_entropy);
  }

  // Ids and views on this GPU: the layout's offsets go up, the ids are gathered and the scores scattered on the
  // device, so neither the ids nor the scores cross to the host. Anything else goes through the host (Policy's).
  void score_into(const TokenRows& batch, const TensorView& logprobs, const TensorView& entropy) override {
    const Device dev = model_.device();
    if (batch.ids.device != dev || logprobs.device != dev || (entropy.data && entropy.device != dev))
      return Policy::score_into(batch, logprobs, entropy);
    const RowsForward f = forward_rows(batch, logprobs, entropy, /*for_backward=*/false);
    score_rows(f, logprobs, entropy);
    device_ops(logprobs, "scores").synchronize_stream(model_.stream(), "scoring token rows");
  }

  DeviceRowsTraining* device_rows_training() override { return this; }

  void score_rows_for_backward(const TokenRows& batch, const TensorView& logprobs, const TensorView& entropy) override {
    check_on_device(batch, logprobs, entropy);
    auto f = std::make_unique<RowsForward>(forward_rows(batch, logprobs, entropy, /*for_backward=*/true));
    score_rows(*f, logprobs, entropy);
    rows_forward_ = std::move(f);
  }

  void backward_rows(const TensorView& d_logprobs) override {
    RT_CHECK(rows_forward_ != nullptr, "policy backward_rows: score_rows_for_backward must run first");
    const RowsForward& f = *rows_forward_;
    RT_CHECK(d_logprobs.device == model_.device() && d_logprobs.dtype == DType::F32 && d_logprobs.is_contiguous() &&
                 d_logprobs.ndim == 2 && d_logprobs.shape[0] == f.ids_rows && d_logprobs.shape[1] == f.ids_cols,
             "policy backward_rows: the gradients must be contiguous float32 [", f.ids_rows, ", ", f.ids_cols, "] on ",
             device_name(model_.device()), ", got ", dtype_name(d_logprobs.dtype), " ", d_logprobs.shape_str(), " on ",
             device_name(d_logprobs.device));
    const ModelConfig& c = model_.config();
    const Tensor d_rows = Tensor::empty({f.n}, DType::F32, model_.device());
    cuda::gather_row_values(d_rows.ptr<float>(), d_logprobs.ptr<float>(), f.result_offsets() + f.rank * f.n, f.n,
                            model_.stream());
    const Tensor d_hidden = Tensor::empty({f.n, c.hidden}, DType::BF16, model_.device());
    cuda::token_logprobs_backward(model_.gemm(), d_hidden.ptr<cuda::bf16>(), model_.lm_head_grad(),
                                  d_rows.ptr<float>(), model_.hidden(), model_.lm_head(), f.targets(), f.n, c.hidden,
                                  c.vocab, chunk_);
    model_.backward(d_hidden.ptr<cuda::bf16>(), *f.attention);
    rows_forward_.reset();
  }

  void score_and_backward_rows(const TokenRows& batch, const DeviceTokenGradient& grad, const TensorView& logprobs,
                               const TensorView& entropy) override {
    check_on_device(batch, logprobs, entropy);
    const RowsForward f = forward_rows(batch, logprobs, entropy, /*for_backward=*/true);
    const ModelConfig& c = model_.config();
    const Device dev = model_.device();
    // Each scored row's (sequence, position), for the loss's kernels: one upload of the layout.
    std::vector<int32_t> seq_pos;
    seq_pos.reserve(static_cast<size_t>(2 * f.n));
    for (const BatchRows::ScoredToken& t : f.rows->scored_tokens()) {
      seq_pos.push_back(t.pos < 0 ? -1 : static_cast<int32_t>(t.seq));
      seq_pos.push_back(static_cast<int32_t>(t.pos));
    }
    const Tensor dev_seq_pos = Tensor::empty({2 * f.n}, DType::I32, dev);
    copy(dev_seq_pos, contiguous_view(seq_pos.data(), DType::I32, Device::cpu(), {2 * f.n}));
    const Tensor d_chunk = Tensor::empty({std::min(f.n, chunk_)}, DType::F32, dev);
    const cuda::DeviceChunkGradient chunk_grad = [&](int64_t first, int64_t rows, const float* lp) -> const float* {
      grad(lp, dev_seq_pos.ptr<int32_t>() + 2 * first, rows, d_chunk.ptr<float>());
      return d_chunk.ptr<float>();
    };
    const Tensor local = Tensor::empty({entropy.data ? 2 * f.n : f.n}, DType::F32, dev);
    const Tensor d_hidden = Tensor::empty({f.n, c.hidden}, DType::BF16, dev);
    cuda::token_logprobs_and_device_backward(model_.gemm(), local.ptr<float>(),
                                             entropy.data ? local.ptr<float>() + f.n : nullptr,
                                             d_hidden.ptr<cuda::bf16>(), model_.lm_head_grad(), chunk_grad, f.hidden,
                                             model_.lm_head(), f.targets(), f.n, c.hidden, c.vocab, chunk_);
    model_.backward(d_hidden.ptr<cuda::bf16>(), *f.attention);
    scatter_rows(f, local, logprobs, entropy);
  }

  void backward(const std::vector<std::vector<float>>& d_logprobs) override {
    RT_CHECK(scored_ != nullptr, "policy backward: score(batch, for_backward=true) must run first");
    const std::vector<float> d_rows = scored_->row_grads<float>(d_logprobs);
    cuda::model_row_logprobs_backward(model_, scored_->targets().data(), d_rows.data(), *attention_, chunk_);
    scored_.reset(), attention_.reset();
  }

  TensorView weights() override { return model_.weight_buffer(); }
  TensorView grads() override { return model_.grad_buffer(); }
  const std::vector<int64_t>& flat_offsets() const override { return offsets_; }
  void zero_grads() override { model_.zero_grads(); }
  bool sum_grad_squares_in_next_backward(double* device_result) override {
    model_.sum_grad_squares_in_next_backward(device_result);
    return true;
  }

  std::vector<float> params() const override { return model_.params(); }
  void set_params(const std::vector<float>& values) override { model_.set_params(values); }
  std::vector<float> grads_by_layout() const override { return model_.grads(); }

  // Generation decodes on this GPU with these weights (model/cuda/gpu_sampler.h); its forwards replace the
  // activations a score(..., for_backward = true) kept (the model's backward then says so).
  std::unique_ptr<DeviceSampler> make_device_sampler(const SamplerOptions& options) override {
    return std::make_unique<cuda::GpuSampler>(model_, options);
  }

 private:
  // One forward over token rows on this GPU: the layout's offsets uploaded once, the tokens and targets gathered
  // from the caller's view there.
  struct RowsForward {
    std::unique_ptr<BatchRows> rows;
    std::unique_ptr<SequenceAttention> attention;
    int64_t n = 0, ids_rows = 0, ids_cols = 0;
    int rank = 0, cp = 1;
    Tensor offsets;    // token offsets [n], target offsets [n], every rank's result offsets [cp * n]
    Tensor tokens;     // tokens [n], then targets [n]
    Tensor positions;  // read by the forward's copy, kept until the work is enqueued
    const cuda::bf16* hidden = nullptr;
    const int64_t* result_offsets() const { return offsets.ptr<int64_t>() + 2 * n; }
    const int32_t* targets() const { return tokens.ptr<int32_t>() + n; }
  };

  void check_on_device(const TokenRows& batch, const TensorView& logprobs, const TensorView& entropy) const {
    const Device dev = model_.device();
    RT_CHECK(batch.ids.device == dev && logprobs.device == dev && (!entropy.data || entropy.device == dev),
             "policy: training from token rows needs the ids and the score views on ", device_name(dev), ", got ",
             device_name(batch.ids.device), " and ", device_name(logprobs.device));
  }

  RowsForward forward_rows(const TokenRows& batch, const TensorView& logprobs, const TensorView& entropy,
                           bool for_backward) {
    check_score_rows(batch, logprobs, entropy, model_.config().vocab);
    scored_.reset(), attention_.reset(), rows_forward_.reset();
    const Device dev = model_.device();
    RowsForward f;
    f.cp = group_ ? group_->size() : 1;
    f.rank = group_ ? group_->rank() : 0;
    f.ids_rows = batch.ids.shape[0], f.ids_cols = batch.ids.shape[1];
    f.rows = std::make_unique<BatchRows>(batch.lengths, batch.packed, f.cp, f.rank);
    f.attention = f.rows->attention(group_, cp_);
    f.n = f.rows->local_tokens();
    const BatchRows::SourceOffsets source =
        f.rows->source_offsets(batch.rows, batch.ids.stride[0], batch.ids.stride[1]);
    std::vector<int64_t> offsets = source.tokens;
    offsets.insert(offsets.end(), source.targets.begin(), source.targets.end());
    const std::vector<int64_t> to = f.rows->result_offsets(batch.rows, batch.ids.shape[1]);
    offsets.insert(offsets.end(), to.begin(), to.end());
    const auto total = static_cast<int64_t>(offsets.size());
    f.offsets = Tensor::empty({total}, DType::I64, dev);
    copy(f.offsets, contiguous_view(offsets.data(), DType::I64, Device::cpu(), {total}));
    f.positions = Tensor::empty({f.n}, DType::I32, dev);
    copy(f.positions,
         contiguous_view(const_cast<int32_t*>(f.rows->positions().data()), DType::I32, Device::cpu(), {f.n}));
    f.tokens = Tensor::empty({2 * f.n}, DType::I32, dev);
    const int64_t* off = f.offsets.ptr<int64_t>();
    cuda::gather_token_rows(batch.ids.data, batch.ids.dtype, off, off + f.n, f.tokens.ptr<int32_t>(),
                            f.tokens.ptr<int32_t>() + f.n, f.n, model_.stream());
    f.hidden = model_.forward_on_device(f.tokens.ptr<int32_t>(), f.positions.ptr<int32_t>(), f.rows->batch(),
                                        f.rows->row_len(), *f.attention, for_backward);
    return f;
  }

  // The LM head over a forward's rows, its logprobs (and entropy when the view has data) into the caller's views.
  void score_rows(const RowsForward& f, const TensorView& logprobs, const TensorView& entropy) {
    const Tensor local = Tensor::empty({entropy.data ? 2 * f.n : f.n}, DType::F32, model_.device());
    cuda::token_logprobs(model_.gemm(), local.ptr<float>(), f.hidden, model_.lm_head(), f.targets(), f.n,
                         model_.config().hidden, model_.config().vocab, chunk_,
                         entropy.data ? local.ptr<float>() + f.n : nullptr);
    scatter_rows(f, local, logprobs, entropy);
  }

  // Every rank's `local` results (logprobs, then entropy when the view has data) into the caller's views.
  void scatter_rows(const RowsForward& f, const Tensor& local, const TensorView& logprobs, const TensorView& entropy) {
    Tensor all = local;
    if (group_) {
      all = Tensor::empty({f.cp * local.numel()}, DType::F32, model_.device());
      group_->all_gather(local.data(), all.data(), static_cast<size_t>(local.numel()), DType::F32);
    }
    cuda::scatter_row_results(logprobs.ptr<float>(), all.ptr<float>(), f.result_offsets(), f.n, f.cp, local.numel(),
                              model_.stream());
    if (entropy.data)
      cuda::scatter_row_results(entropy.ptr<float>(), all.ptr<float>() + f.n, f.result_offsets(), f.n, f.cp,
                                local.numel(), model_.stream());
  }

  // The forward of score(): rows laid out, targets uploaded, the model run, `local` allocated for the LM head.
  Scoring begin(const TokenBatch& batch, bool for_backward, bool with_entropy) {
    scored_.reset(), attention_.reset(), rows_forward_.reset();
    Scoring s;
    s.rows = std::make_unique<BatchRows>(batch, model_.config().vocab, group_ ? group_->size() : 1,
                                         group_ ? group_->rank() : 0);
    s.attention = s.rows->attention(group_, cp_);
    s.n = s.rows->local_tokens();
    const Device dev = model_.device();
    s.targets = Tensor::empty({s.n}, DType::I32, dev);
    copy(s.targets,
         contiguous_view(const_cast<int32_t*>(s.rows->targets().data()), DType::I32, Device::cpu(), {s.n}));
    s.hidden = model_.forward(s.rows->tokens().data(), s.rows->positions().data(), s.rows->batch(),
                              s.rows->row_len(), *s.attention, for_backward);
    s.local = Tensor::empty({with_entropy ? 2 * s.n : s.n}, DType::F32, dev);
    return s;
  }

  // Every rank's results per sequence: logprobs then entropy, next to each other, so one gather under CP, straight
  // from device memory.
  TokenScores gather(const Scoring& s, bool with_entropy) {
    const int64_t per_rank = s.local.numel();
    const int world = group_ ? group_->size() : 1;
    Tensor all = s.local;
    if (group_) {
      all = Tensor::empty({world * per_rank}, DType::F32, model_.device());
      group_->all_gather(s.local.data(), all.data(), static_cast<size_t>(per_rank), DType::F32);
    }
    std::vector<float> host(static_cast<size_t>(world * per_rank));
    copy(contiguous_view(host.data(), DType::F32, Device::cpu(), {world * per_rank}), all);
    TokenScores scores;
    scores.logprobs = s.rows->to_tokens(host.data(), per_rank);
    if (with_entropy) scores.entropy = s.rows->to_tokens(host.data() + s.n, per_rank);
    return scores;
  }

  cuda::GpuModel model_;
  int64_t chunk_;
  comm::Communicator* group_;
  cp::CpConfig cp_;
  std::vector<int64_t> offsets_;
  // What the last score(..., for_backward = true) ran, for backward().
  std::unique_ptr<BatchRows> scored_;
  std::unique_ptr<SequenceAttention> attention_;
  // What the last score_rows_for_backward ran, for backward_rows().
  std::unique_ptr<RowsForward> rows_forward_;
};

}  // namespace

std::unique_ptr<Policy> make_gpu_policy(const ModelConfig& config, const std::vector<float>& params,
                                        const PolicyOptions& options) {
  return std::make_unique<GpuPolicy>(config, params, options);
}

}  // namespace ringtrain::model
