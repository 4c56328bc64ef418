// Shared by the trainer and checkpoint tests: a tiny random Llama, a global batch for each loss (sequences of
// different lengths, prompt tokens masked, one sample masked out), a policy wrapper that can poison gradients, and
// running a trainer on an in-process dp × cp mesh.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "host_adamw.h"
#include "model/model_test_util.h"
#include "ringtrain/attention/backend.h"
#include "ringtrain/comm/in_process.h"
#include "ringtrain/model/policy.h"
#include "ringtrain/train/trainer.h"
#include "test_util.h"

namespace ringtrain::testing {

struct TrainSetup {
  model::ModelConfig config;
  std::vector<float> params;
  train::TrainBatch batch;
  train::TrainerConfig cfg;
};

inline model::PolicyOptions train_policy_options(DType dtype, comm::Communicator* cp_group) {
  model::PolicyOptions o;
  o.dtype = dtype;
  o.logprob_chunk = 7;  // several LM-head chunks per microbatch
  o.model.attention_backends = {attention::BackendId::Math};
  o.cp_group = cp_group;
  return o;
}

// Hidden 32, 4 query / 2 kv heads of 8, ffn 48, vocab 97, 2 layers.
inline model::ModelConfig train_config() {
  model::ModelConfig c = tiny_config(model::Arch::Llama);
  c.hidden = 32, c.head_dim = 8, c.ffn = 48, c.vocab = 97;
  return c;
}

inline TrainSetup make_train_setup(train::LossKind kind, std::mt19937_64& rng, int sequences = 8,
                                   const model::ModelConfig& config = train_config()) {
  TrainSetup s;
  s.config = config;
  s.params = tiny_params(s.config, rng);
  train::TrainBatch& b = s.batch;
  std::uniform_int_distribution<int> len(4, 17);
  for (int i = 0; i < sequences; ++i) {
    const int n = len(rng);
    b.sequences.push_back(random_ids(n, s.config.vocab, rng));
    std::vector<uint8_t> mask(n, 1);
    const int prompt = std::uniform_int_distribution<int>(1, n / 2)(rng);
    for (int p = 0; p < prompt; ++p) mask[p] = 0;
    b.token_mask.push_back(mask);
  }
  b.sample_mask.assign(sequences, 1);
  const int masked = std::uniform_int_distribution<int>(0, sequences / 2 - 1)(rng);
  if (kind == train::LossKind::DPO) b.sample_mask[2 * masked] = b.sample_mask[2 * masked + 1] = 0;
  else b.sample_mask[masked] = 0;

  // The current policy's logprobs, so that ratios and rewards are near where training happens.
  const auto policy = model::make_policy(s.config, s.params, train_policy_options(DType::F64, nullptr));
  const model::TokenScores cur = policy->score({b.sequences}, false);
  std::normal_distribution<float> nd;
  const auto near = [&](const std::vector<std::vector<float>>& base, float noise) {
    std::vector<std::vector<float>> out = base;
    for (auto& row : out)
      for (float& x : row) x += noise * nd(rng);
    return out;
  };
  train::TrainerConfig& cfg = s.cfg;
  cfg.micro_batch_size = 2;
  cfg.loss.kind = kind;
  if (kind == train::LossKind::ClippedPG) {
    b.prev_logprobs = near(cur.logprobs, 0.2f);
    b.gen_logprobs = near(b.prev_logprobs, 0.05f);
    b.ref_logprobs = near(cur.logprobs, 0.1f);
    for (const auto& seq : b.sequences) b.advantages.emplace_back(seq.size(), nd(rng));
    cfg.loss.pg.eps_low = 0.2, cfg.loss.pg.eps_high = 0.28, cfg.loss.pg.dual_clip = 3;
    cfg.loss.pg.kl_beta = 0.05;
  }
  if (kind == train::LossKind::DPO) {
    b.ref_logprobs = near(cur.logprobs, 0.1f);
    cfg.loss.dpo.beta = 0.5, cfg.loss.dpo.nll_coef = 0.1;
  }
  cfg.adamw.eps = 1e-3;  // of the gradients' order: the update is smooth in the gradient (see trainer_test.cpp)
  cfg.adamw.weight_decay = 0.01;
  cfg.adamw.max_grad_norm = 1.0;
  cfg.schedule.base_lr = 1e-2;
  cfg.schedule.warmup_steps = 3;
  cfg.schedule.warmup_start_factor = 0.3;
  cfg.schedule.decay = train::ScheduleConfig::Decay::Cosine;
  cfg.schedule.decay_steps = 10;
  cfg.schedule.min_lr = 1e-3;
  return s;
}

// The policy's weights in layout order, in fp64 (exact for an F64 policy, whose params() rounds to fp32).
inline std::vector<double> layout_weights(model::Policy& p) {
  const TensorView w = p.weights();
  std::vector<double> out(static_cast<size_t>(p.layout().total()));
  for (size_t i = 0; i < p.layout().specs().size(); ++i) {
    const model::ParamSpec& s = p.layout().specs()[i];
    for (int64_t e = 0; e < s.numel; ++e) out[s.offset + e] = load_as_double(w.data, w.dtype, p.flat_offsets()[i] + e);
  }
  return out;
}

// Forwards everything to a policy; tests override what they change.
class ForwardingPolicy : public model::Policy {
 public:
  explicit ForwardingPolicy(model::Policy& inner) : inner_(inner) {}

  const model::ModelConfig& config() const override { return inner_.config(); }
  const model::ParamLayout& layout() const override { return inner_.layout(); }
  Device device() const override { return inner_.device(); }
  DType dtype() const override { return inner_.dtype(); }
  model::TokenScores score(const model::TokenBatch& b, bool for_backward, bool with_entropy) override {
    return inner_.score(b, for_backward, with_entropy);
  }
  void backward(const std::vector<std::vector<float>>& d) override { inner_.backward(d); }
  TensorView weights() override { return inner_.weights(); }
  TensorView grads() override { return inner_.grads(); }
  const std::vector<int64_t>& flat_offsets() const override { return inner_.flat_offsets(); }
  void zero_grads() override { inner_.zero_grads(); }
  std::vector<float> params() const override { return inner_.params(); }
  void set_params(const std::vector<float>& v) override { inner_.set_params(v); }
  std::vector<float> grads_by_layout() const override { return inner_.grads_by_layout(); }

 protected:
  model::Policy& inner_;
};

// Runs after_backward (when set) after each backward.
class InjectingPolicy final : public ForwardingPolicy {
 public:
  using ForwardingPolicy::ForwardingPolicy;
  std::function<void()> after_backward;

  void backward(const std::vector<std::vector<float>>& d) override {
    inner_.backward(d);
    if (after_backward) after_backward();
  }
};

// A CPU policy whose flat buffers are laid out otherwise: tensors in reverse order, each after a gap of 3 NaN
// elements (as the GPU layout has alignment gaps and its own order). The inner policy computes; weights are pushed
// into it before scoring and gradients pulled out of it after each backward.
class GappedPolicy final : public model::Policy {
 public:
  explicit GappedPolicy(std::unique_ptr<model::Policy> inner) : inner_(std::move(inner)) {
    const auto& specs = inner_->layout().specs();
    offsets_.resize(specs.size());
    int64_t at = 0;
    for (size_t k = specs.size(); k-- > 0;) {
      at += 3;
      offsets_[k] = at;
      at += specs[k].numel;
    }
    weights_ = Tensor::empty({at + 3}, inner_->weights().dtype);
    grads_ = Tensor::empty({at + 3}, inner_->grads().dtype);
    fill(weights_, NAN);
    fill(grads_, NAN);
    move_tensors(weights_, inner_->weights(), true);
  }

  const model::ModelConfig& config() const override { return inner_->config(); }
  const model::ParamLayout& layout() const override { return inner_->layout(); }
  Device device() const override { return inner_->device(); }
  DType dtype() const override { return inner_->dtype(); }
  model::TokenScores score(const model::TokenBatch& b, bool for_backward, bool with_entropy) override {
    move_tensors(weights_, inner_->weights(), false);
    return inner_->score(b, for_backward, with_entropy);
  }
  void backward(const std::vector<std::vector<float>>& d) override {
    inner_->backward(d);
    move_tensors(grads_, inner_->grads(), true);
  }
  TensorView weights() override { return weights_; }
  TensorView grads() override { return grads_; }
  const std::vector<int64_t>& flat_offsets() const override { return offsets_; }
  void zero_grads() override {
    inner_->zero_grads();
    move_tensors(grads_, inner_->grads(), true);
  }
  std::vector<float> params() const override {
    move_tensors(weights_, inner_->weights(), false);
    return inner_->params();
  }
  void set_params(const std::vector<float>& v) override {
    inner_->set_params(v);
    move_tensors(weights_, inner_->weights(), true);
  }
  std::vector<float> grads_by_layout() const override { return inner_->grads_by_layout(); }

 private:
  // Copies every tensor from the inner policy's buffer into ours (into_ours) or back.
  void move_tensors(const Tensor& ours, const TensorView& inner, bool into_ours) const {
    for (size_t i = 0; i < offsets_.size(); ++i) {
      const int64_t n = inner_->layout().specs()[i].numel;
      const TensorView a = ours.view().slice(0, offsets_[i], n), b = inner.slice(0, inner_->flat_offsets()[i], n);
      into_ours ? copy(a, b) : copy(b, a);
    }
  }
  std::unique_ptr<model::Policy> inner_;
  std::vector<int64_t> offsets_;
  Tensor weights_, grads_;
};

// Runs fn(trainer, policy, mesh) on every rank of an in-process dp × cp mesh, with a fresh policy of s's weights
// (a GappedPolicy around it with `gapped`).
inline void on_mesh(const TrainSetup& s, DType dtype, train::MeshShape shape,
                    const std::function<void(train::Trainer&, model::Policy&, const train::Mesh&)>& fn,
                    bool gapped = false) {
  comm::run_ranks(shape.dp * shape.cp, std::chrono::seconds(120), [&](comm::Communicator& world) {
    const train::Mesh mesh(world, shape);
    std::unique_ptr<model::Policy> policy =
        model::make_policy(s.config, s.params, train_policy_options(dtype, &mesh.cp_group()));
    if (gapped) policy = std::make_unique<GappedPolicy>(std::move(policy));
    train::Trainer trainer(s.cfg, *policy, mesh);
    fn(trainer, *policy, mesh);
  });
}

struct MeshRun {
  std::vector<std::vector<train::StepResult>> results;  // [world rank][step]
  std::vector<std::vector<double>> weights;             // [world rank]: after the last step, layout order
};

inline MeshRun run_on_mesh(const TrainSetup& s, DType dtype, train::MeshShape shape, int steps) {
  MeshRun out;
  out.results.resize(shape.dp * shape.cp);
  out.weights.resize(shape.dp * shape.cp);
  on_mesh(s, dtype, shape, [&](train::Trainer& t, model::Policy& p, const train::Mesh& mesh) {
    const int r = mesh.world().rank();
    for (int i = 0; i < steps; ++i) out.results[r].push_back(t.step(s.batch));
    out.weights[r] = layout_weights(p);
  });
  return out;
}

// The reference step: one policy (on options.device), the whole batch as one microbatch, the loss on it, backward, and host AdamW over
// the whole flat vector (host_adamw.h's AdamW, not the trainer's shards). Returns the new weights in layout order.
inline std::vector<double> reference_step(const TrainSetup& s, const model::PolicyOptions& options, double* loss,
                                          double* grad_norm) {
  using namespace train;
  const auto policy = model::make_policy(s.config, s.params, options);
  const TrainBatch& b = s.batch;
  const int64_t n = static_cast<int64_t>(b.sequences.size());
  int64_t seq = 0;
  for (const auto& t : b.sequences) seq = std::max<int64_t>(seq, static_cast<int64_t>(t.size()));
  std::vector<uint8_t> tmask(static_cast<size_t>(n * seq), 0), smask(b.sample_mask);
  std::vector<double> prev(n * seq), adv(n * seq), ref(n * seq), gen(n * seq), lp(n * seq), ent(n * seq);
  const model::TokenScores sc = policy->score({b.sequences}, true, true);
  for (int64_t i = 0; i < n; ++i)
    for (size_t p = 0; p < b.sequences[i].size(); ++p) {
      const size_t at = i * seq + p;
      tmask[at] = b.token_mask[i][p];
      lp[at] = sc.logprobs[i][p], ent[at] = sc.entropy[i][p];
      if (!b.prev_logprobs.empty()) prev[at] = b.prev_logprobs[i][p], adv[at] = b.advantages[i][p];
      if (!b.ref_logprobs.empty()) ref[at] = b.ref_logprobs[i][p];
      if (!b.gen_logprobs.empty()) gen[at] = b.gen_logprobs[i][p];
    }
  const TokenMasks masks{n, seq, tmask, smask};
  std::vector<double> g(n * seq);
  LossResult r;
  switch (s.cfg.loss.kind) {
    case LossKind::NLL: r = nll_loss<double>(masks, lp, count_valid(masks), g); break;
    case LossKind::ClippedPG: {
      ClippedPGInputs<double> in{lp, prev, adv, ref, gen, ent};
      r = clipped_pg_loss<double>(masks, in, s.cfg.loss.pg, count_valid(masks), g);
      break;
    }
    case LossKind::DPO: r = dpo_loss<double>(masks, lp, ref, s.cfg.loss.dpo, count_dpo_pairs(masks), g); break;
  }
  *loss = r.loss;
  std::vector<std::vector<float>> d(n);
  for (int64_t i = 0; i < n; ++i)
    for (size_t p = 0; p < b.sequences[i].size(); ++p) d[i].push_back(static_cast<float>(g[i * seq + p]));
  policy->backward(d);
  const std::vector<float> grads32 = policy->grads_by_layout();
  std::vector<double> grads(grads32.begin(), grads32.end());
  if (options.dtype == DType::F64) {  // the fp64 gradients themselves, in layout order
    const TensorView gv = policy->grads();
    const auto& off = policy->flat_offsets();
    for (size_t i = 0; i < off.size(); ++i) {
      const model::ParamSpec& sp = policy->layout().specs()[i];
      for (int64_t e = 0; e < sp.numel; ++e) grads[sp.offset + e] = gv.ptr<double>()[off[i] + e];
    }
  }
  const std::vector<float> start = policy->params();  // as the policy holds them (bf16 on a GPU)
  std::vector<double> master(start.begin(), start.end());
  AdamW<double> opt(s.cfg.adamw, 0, static_cast<int64_t>(master.size()));
  const AdamWStep st = opt.step(master, grads, lr_at(s.cfg.schedule, 0), [&] {
    double sq = 0;
    for (double x : grads) sq += x * x;
    return sq;
  }());
  *grad_norm = st.grad_norm;
  return master;
}

}  // namespace ringtrain::testing
