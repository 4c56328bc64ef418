// The GPU model as a Policy: bf16 weights, fp32 gradients and LM head, one microbatch as one padded or packed
// forward (BatchRows, as the CPU policy), context parallelism over the NCCL communicator of PolicyOptions.
#include "ringtrain/core/error.h"
#include "ringtrain/model/batch_rows.h"
#include "ringtrain/model/cuda/gpu_logprobs.h"
#include "ringtrain/model/cuda/gpu_sampler.h"
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

class GpuPolicy final : public Policy {
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
    scored_.reset(), attention_.reset();
    const ModelConfig& c = model_.config();
    auto rows = std::make_unique<BatchRows>(batch, c.vocab, group_ ? group_->size() : 1, group_ ? group_->rank() : 0);
    std::unique_ptr<SequenceAttention> attention = rows->attention(group_, cp_);
    const int64_t n = rows->local_tokens(), per_rank = with_entropy ? 2 * n : n;
    const Device dev = model_.device();
    const Tensor targets = Tensor::empty({n}, DType::I32, dev);
    copy(targets, contiguous_view(const_cast<int32_t*>(rows->targets().data()), DType::I32, Device::cpu(), {n}));
    const cuda::bf16* hidden = model_.forward(rows->tokens().data(), rows->positions().data(), rows->batch(),
                                              rows->row_len(), *attention, for_backward);
    // logprobs then entropy, next to each other: one gather under CP, straight from device memory
    const Tensor local = Tensor::empty({per_rank}, DType::F32, dev);
    cuda::token_logprobs(model_.gemm(), local.ptr<float>(), hidden, model_.lm_head(), targets.ptr<int32_t>(), n,
                         c.hidden, c.vocab, chunk_, with_entropy ? local.ptr<float>() + n : nullptr);
    const int world = group_ ? group_->size() : 1;
    Tensor all = local;
    if (group_) {
      all = Tensor::empty({world * per_rank}, DType::F32, dev);
      group_->all_gather(local.data(), all.data(), static_cast<size_t>(per_rank), DType::F32);
    }
    std::vector<float> host(static_cast<size_t>(world * per_rank));
    copy(contiguous_view(host.data(), DType::F32, Device::cpu(), {world * per_rank}), all);
    TokenScores scores;
    scores.logprobs = rows->to_tokens(host.data(), per_rank);
    if (with_entropy) scores.entropy = rows->to_tokens(host.data() + n, per_rank);
    if (for_backward) scored_ = std::move(rows), attention_ = std::move(attention);
    return scores;
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

  std::vector<float> params() const override { return model_.params(); }
  void set_params(const std::vector<float>& values) override { model_.set_params(values); }
  std::vector<float> grads_by_layout() const override { return model_.grads(); }

  // Generation decodes on this GPU with these weights (model/cuda/gpu_sampler.h); its forwards replace the
  // activations a score(..., for_backward = true) kept (the model's backward then says so).
  std::unique_ptr<DeviceSampler> make_device_sampler(const SamplerOptions& options) override {
    return std::make_unique<cuda::GpuSampler>(model_, options);
  }

 private:
  cuda::GpuModel model_;
  int64_t chunk_;
  comm::Communicator* group_;
  cp::CpConfig cp_;
  std::vector<int64_t> offsets_;
  // What the last score(..., for_backward = true) ran, for backward().
  std::unique_ptr<BatchRows> scored_;
  std::unique_ptr<SequenceAttention> attention_;
};

}  // namespace

std::unique_ptr<Policy> make_gpu_policy(const ModelConfig& config, const std::vector<float>& params,
                                        const PolicyOptions& options) {
  return std::make_unique<GpuPolicy>(config, params, options);
}

}  // namespace ringtrain::model
