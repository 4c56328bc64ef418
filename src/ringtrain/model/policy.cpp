#include "ringtrain/model/policy.h"

#include <type_traits>

#include "ringtrain/core/error.h"
#include "ringtrain/model/generate.h"
#include "ringtrain/model/gpu_policy.h"
#include "ringtrain/model/logprobs.h"
#include "ringtrain/model/batch_rows.h"

namespace ringtrain::model {
namespace {

const ParamSpec& spec_named(const Policy& policy, const std::string& name) {
  const ParamSpec* spec = policy.layout().find(name);
  RT_CHECK(spec != nullptr, "policy: no weight named '", name, "' in a ", arch_class_name(policy.config().arch));
  return *spec;
}

std::vector<float> slice(const std::vector<float>& values, const ParamSpec& spec) {
  return {values.begin() + spec.offset, values.begin() + spec.offset + spec.numel};
}

// The CPU model in fp32 or fp64. A microbatch runs as one padded or packed forward (BatchRows): one pass over
// the weights for the whole batch instead of one per sequence, with the activations of every sequence kept for the
// backward (a DPO loss needs the chosen and the rejected scored before either backward).
template <typename T>
class CpuPolicy final : public Policy {
 public:
  static constexpr DType kDType = std::is_same_v<T, double> ? DType::F64 : DType::F32;

  // Params: the weights, owned (std::vector<float>) or shared (std::shared_ptr<const std::vector<float>>).
  template <typename Params>
  CpuPolicy(const ModelConfig& config, Params params, const PolicyOptions& options)
      : model_(config, std::move(params), options.model),
        chunk_(options.logprob_chunk > 0 ? options.logprob_chunk : kDefaultLogprobChunk),
        group_(options.cp_group && options.cp_group->size() > 1 ? options.cp_group : nullptr), cp_(options.cp) {
    RT_CHECK(options.logprob_chunk >= 0, "policy: LM-head chunk ", options.logprob_chunk, " must not be negative");
    RT_CHECK(!group_ || group_->device().is_cpu(), "policy: a CPU model's cp group must be in host memory, not ",
             device_name(group_->device()));
    for (const ParamSpec& s : model_.layout().specs()) offsets_.push_back(s.offset);
  }

  const ModelConfig& config() const override { return model_.config(); }
  const ParamLayout& layout() const override { return model_.layout(); }
  Device device() const override { return Device::cpu(); }
  DType dtype() const override { return kDType; }

  TokenScores score(const TokenBatch& batch, bool for_backward, bool with_entropy) override {
    scored_.reset(), attention_.reset();
    const ModelConfig& c = model_.config();
    auto rows = std::make_unique<BatchRows>(batch, c.vocab, group_ ? group_->size() : 1, group_ ? group_->rank() : 0);
    std::unique_ptr<SequenceAttention> attention = rows->attention(group_, cp_);
    const int64_t n = rows->local_tokens();
    const std::vector<T>& hidden = model_.forward(rows->tokens().data(), rows->positions().data(), rows->batch(),
                                                  rows->row_len(), *attention, for_backward);
    // logprobs then entropy: one gather under CP
    std::vector<T> local(static_cast<size_t>(with_entropy ? 2 * n : n));
    token_logprobs(local.data(), hidden.data(), model_.lm_head(), rows->targets().data(), n, c.hidden, c.vocab, chunk_,
                   with_entropy ? local.data() + n : nullptr);
    std::vector<T> all;
    if (group_) {
      all.resize(local.size() * static_cast<size_t>(group_->size()));
      group_->all_gather(local.data(), all.data(), local.size(), kDType);
    }
    const T* gathered = group_ ? all.data() : local.data();
    TokenScores scores;
    scores.logprobs = rows->to_tokens(gathered, static_cast<int64_t>(local.size()));
    if (with_entropy) scores.entropy = rows->to_tokens(gathered + n, static_cast<int64_t>(local.size()));
    if (for_backward) scored_ = std::move(rows), attention_ = std::move(attention);
    return scores;
  }

  void backward(const std::vector<std::vector<float>>& d_logprobs) override {
    RT_CHECK(scored_ != nullptr, "policy backward: score(batch, for_backward=true) must run first");
    const std::vector<T> d_rows = scored_->row_grads<T>(d_logprobs);
    model_row_logprobs_backward(model_, scored_->targets().data(), d_rows.data(), *attention_, chunk_);
    scored_.reset(), attention_.reset();
  }

  TensorView weights() override {
    return contiguous_view(model_.params().data(), kDType, Device::cpu(), {layout().total()});
  }
  TensorView grads() override {
    if (model_.grads().empty()) model_.zero_grads();
    return contiguous_view(model_.grads().data(), kDType, Device::cpu(), {layout().total()});
  }
  const std::vector<int64_t>& flat_offsets() const override { return offsets_; }
  void zero_grads() override { model_.zero_grads(); }

  std::vector<float> params() const override { return to_float(model_.params()); }
  void set_params(const std::vector<float>& values) override {
    RT_CHECK(static_cast<int64_t>(values.size()) == layout().total(), "policy: ", values.size(),
             " parameter values for a layout of ", layout().total());
    model_.params().assign(values.begin(), values.end());  // a policy over shared weights takes its own copy
  }
  std::vector<float> grads_by_layout() const override {
    const std::vector<T>& g = model_.grads();
    return g.empty() ? std::vector<float>(static_cast<size_t>(layout().total()), 0.f) : to_float(g);
  }

 private:
  static std::vector<float> to_float(const std::vector<T>& v) { return {v.begin(), v.end()}; }

  Model<T> model_;
  int64_t chunk_;
  comm::Communicator* group_;
  cp::CpConfig cp_;
  std::vector<int64_t> offsets_;
  // What the last score(..., for_backward = true) ran, for backward().
  std::unique_ptr<BatchRows> scored_;
  std::unique_ptr<SequenceAttention> attention_;
};

}  // namespace

std::unique_ptr<DeviceSampler> Policy::make_device_sampler(const SamplerOptions&) { return nullptr; }

bool Policy::sum_grad_squares_in_next_backward(double*) { return false; }

std::vector<float> Policy::param(const std::string& name) const { return slice(params(), spec_named(*this, name)); }
std::vector<float> Policy::grad(const std::string& name) const {
  return slice(grads_by_layout(), spec_named(*this, name));
}

TokenScores Policy::score_and_backward(const TokenBatch& batch, const TokenGradient& grad, bool with_entropy) {
  TokenScores scores = score(batch, /*for_backward=*/true, with_entropy);
  std::vector<std::vector<float>> d(scores.logprobs.size());
  for (size_t b = 0; b < d.size(); ++b) {
    d[b].assign(scores.logprobs[b].size(), 0.f);
    for (size_t p = 1; p < d[b].size(); ++p)
      d[b][p] = static_cast<float>(grad(static_cast<int64_t>(b), static_cast<int64_t>(p), scores.logprobs[b][p]));
  }
  backward(d);
  return scores;
}

void Policy::score_into(const TokenRows& batch, const TensorView& logprobs, const TensorView& entropy) {
  check_score_rows(batch, logprobs, entropy, config().vocab);
  TokenBatch host;
  host.packed = batch.packed;
  for (size_t i = 0; i < batch.rows.size(); ++i) {
    std::vector<int32_t>& seq = host.sequences.emplace_back(static_cast<size_t>(batch.lengths[i]));
    copy(contiguous_view(seq.data(), DType::I32, Device::cpu(), {1, batch.lengths[i]}),
         batch.ids.slice(0, batch.rows[i], 1).slice(1, 0, batch.lengths[i]));
  }
  const bool with_entropy = entropy.data != nullptr;
  TokenScores scores = score(host, /*for_backward=*/false, with_entropy);
  const auto put = [&](const TensorView& out, std::vector<float>& values, size_t i) {
    const int64_t n = batch.lengths[i] - 1;
    if (n > 0)
      copy(out.slice(0, batch.rows[i], 1).slice(1, 1, n),
           contiguous_view(values.data() + 1, DType::F32, Device::cpu(), {1, n}));
  };
  for (size_t i = 0; i < batch.rows.size(); ++i) {
    put(logprobs, scores.logprobs[i], i);
    if (with_entropy) put(entropy, scores.entropy[i], i);
  }
}

std::unique_ptr<Policy> make_policy(const ModelConfig& config, const std::vector<float>& params,
                                    const PolicyOptions& options) {
  if (!options.device.is_cpu()) return make_gpu_policy(config, params, options);
  if (options.dtype == DType::F64)
    return std::make_unique<CpuPolicy<double>>(config, std::vector<float>(params), options);
  RT_CHECK(options.dtype == DType::F32, "policy: the CPU model computes in f32 or f64, not ",
           dtype_name(options.dtype));
  return std::make_unique<CpuPolicy<float>>(config, std::vector<float>(params), options);
}

std::unique_ptr<Policy> make_policy(const ModelConfig& config, std::shared_ptr<const std::vector<float>> params,
                                    const PolicyOptions& options) {
  RT_CHECK(params != nullptr, "policy: no weights");
  if (!options.device.is_cpu() || options.dtype != DType::F32) return make_policy(config, *params, options);
  return std::make_unique<CpuPolicy<float>>(config, std::move(params), options);
}

std::unique_ptr<Policy> load_policy(const std::filesystem::path& dir, const PolicyOptions& options) {
  const ModelConfig config = load_config(dir);
  // Shared by this policy alone: an fp32 CPU policy keeps the loaded buffer instead of a copy of it.
  return make_policy(config, std::make_shared<const std::vector<float>>(load_checkpoint_params(dir, config)), options);
}

}  // namespace ringtrain::model
