#include "ringtrain/worker/policy_worker.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <system_error>

#include "ringtrain/comm/agreed.h"
#include "ringtrain/core/clock.h"
#include "ringtrain/core/device_info.h"
#include "ringtrain/core/device_ops.h"
#include "ringtrain/core/error.h"
#include "ringtrain/model/file_io.h"
#include "ringtrain/model/params.h"
#include "ringtrain/worker/packing.h"

namespace ringtrain::worker {
namespace fs = std::filesystem;

train::TrainerConfig trainer_config(const Config& c) {
  train::TrainerConfig t;
  t.micro_batch_size = c.policy.train_micro_batch_size * (c.loss_fn.type == LossType::Dpo ? 2 : 1);
  // Packed bins or length buckets by token budget; fixed runs of micro_batch_size otherwise (the trainer's own).
  if (c.policy.sequence_packing.enabled || c.policy.dynamic_batching.enabled) {
    t.plan = [c](const std::vector<int64_t>& lengths) {
      std::vector<std::vector<int64_t>> out;
      for (Microbatch& mb : plan_microbatches(c, lengths, Pass::Train)) out.push_back(std::move(mb.sequences));
      return out;
    };
  }
  t.packed = c.policy.sequence_packing.enabled;
  const LossConfig& l = c.loss_fn;
  switch (l.type) {
    case LossType::Nll:
      t.loss.kind = train::LossKind::NLL;
      break;
    case LossType::ClippedPg:
      t.loss.kind = train::LossKind::ClippedPG;
      break;
    case LossType::Dpo:
      t.loss.kind = train::LossKind::DPO;
      break;
  }
  t.loss.pg.eps_low = l.ratio_clip_min;
  t.loss.pg.eps_high = l.ratio_clip_max;
  t.loss.pg.dual_clip = l.ratio_clip_c.value_or(0.0);
  t.loss.pg.kl_beta = l.reference_policy_kl_penalty;
  t.loss.pg.kl_estimator = l.reference_policy_kl_type == KlType::K1   ? train::KLEstimator::K1
                           : l.reference_policy_kl_type == KlType::K2 ? train::KLEstimator::K2
                                                                      : train::KLEstimator::K3;
  t.loss.pg.aggregation = l.token_level_loss ? train::Aggregation::TokenMean : train::Aggregation::SequenceMean;
  t.loss.dpo.beta = l.reference_policy_kl_penalty;
  t.loss.dpo.nll_coef = l.sft_loss_weight;
  const OptimizerConfig& o = c.policy.optimizer;
  t.adamw.beta1 = o.beta1, t.adamw.beta2 = o.beta2, t.adamw.eps = o.eps, t.adamw.weight_decay = o.weight_decay;
  t.adamw.max_grad_norm = c.policy.max_grad_norm;
  const SchedulerConfig& s = c.policy.scheduler;
  t.schedule.base_lr = o.lr;
  t.schedule.warmup_steps = s.warmup_steps;
  t.schedule.warmup_start_factor = s.warmup_steps > 0 ? 1.0 / static_cast<double>(s.warmup_steps) : 1.0;
  if (s.kind == ScheduleKind::Cosine) {
    t.schedule.decay = train::ScheduleConfig::Decay::Cosine;
    RT_CHECK(c.total_scheduler_steps() > s.warmup_steps, "policy.scheduler.kind = cosine needs total_steps (",
             c.total_scheduler_steps(), ", or train.steps when 0) above policy.scheduler.warmup_steps (",
             s.warmup_steps, ")");
    t.schedule.decay_steps = c.total_scheduler_steps() - s.warmup_steps;
    t.schedule.min_lr = s.min_lr;
  }
  return t;
}

namespace {

model::PolicyOptions policy_options(const Config& c, const model::ModelConfig& m, comm::Communicator& world,
                                    comm::Communicator& cp_group) {
  model::PolicyOptions po;
  po.device = c.device.is_cuda() ? world.device() : Device::cpu();
  po.dtype = c.compute_dtype();
  po.model.attention_backends = c.attention_backends;
  if (c.policy.dtensor_cfg.activation_checkpointing)
    po.model.checkpoint_layers = model::ModelOptions::checkpoint_all(m.layers);
  po.logprob_chunk = c.policy.logprob_chunk_size;
  po.cp_group = &cp_group;
  po.cp.comm = c.parallel.cp_comm;
  return po;
}

// Sums a contiguous view over a communicator in place, through a buffer on the communicator's device when the view
// lives elsewhere.
void all_reduce_sum(comm::Communicator& comm, const TensorView& values) {
  if (comm.size() == 1 || values.numel() == 0) return;
  const size_t n = static_cast<size_t>(values.numel());
  if (values.device == comm.device()) {
    comm.all_reduce(values.data, n, values.dtype, comm::ReduceOp::Sum);
    return;
  }
  const TensorView flat = contiguous_view(values.data, values.dtype, values.device, {values.numel()});
  Tensor buf = Tensor::empty({values.numel()}, values.dtype, comm.device());
  copy(buf, flat);
  comm.all_reduce(buf.data(), n, values.dtype, comm::ReduceOp::Sum);
  copy(flat, buf);
}

void all_reduce_sum(comm::Communicator& comm, std::vector<float>& values) {
  const auto n = static_cast<int64_t>(values.size());
  all_reduce_sum(comm, contiguous_view(values.data(), DType::F32, Device::cpu(), {n}));
}

std::vector<uint8_t> to_mask(const std::vector<float>& m) {
  std::vector<uint8_t> out(m.size());
  for (size_t i = 0; i < m.size(); ++i) out[i] = m[i] != 0.0f;
  return out;
}

void check_samples(const std::vector<Sample>& samples, const model::ModelConfig& m, int64_t max_length,
                   const char* what) {
  RT_CHECK(!samples.empty(), what, ": the batch is empty");
  for (size_t i = 0; i < samples.size(); ++i) {
    const Sample& s = samples[i];
    RT_CHECK(s.length() >= 1 && s.length() <= max_length, what, ": sample ", i, " has ", s.length(),
             " tokens; policy.max_total_sequence_length allows 1 to ", max_length);
    for (size_t p = 0; p < s.input_ids.size(); ++p)
      RT_CHECK(s.input_ids[p] >= 0 && s.input_ids[p] < m.vocab, what, ": sample ", i, " input_ids[", p,
               "] = ", s.input_ids[p], " is not a token id in [0, ", m.vocab, ")");
    const auto check_len = [&](const std::vector<float>& v, const char* field) {
      RT_CHECK(v.empty() || v.size() == s.input_ids.size(), what, ": sample ", i, " ", field, " has ", v.size(),
               " entries for ", s.length(), " tokens");
    };
    check_len(s.token_mask, "token_mask");
    check_len(s.advantages, "advantages");
    check_len(s.generation_logprobs, "generation_logprobs");
    check_len(s.prev_logprobs, "prev_logprobs");
    check_len(s.reference_logprobs, "reference_logprobs");
  }
}

// DIR's temporary sibling for a write that renames it into place.
fs::path sibling(const fs::path& dir, const char* suffix) {
  fs::path d = dir.lexically_normal();
  if (!d.has_filename()) d = d.parent_path();
  return d.parent_path() / (d.filename().string() + suffix);
}

}  // namespace

struct PolicyWorker::State {
  Config config;
  model::ModelConfig model;
  comm::Communicator* world = nullptr;
  const StopRequest* stop = nullptr;  // a long call stops at its next microbatch when asked (not owned)
  std::unique_ptr<train::Mesh> mesh;
  model::PolicyOptions policy_options;
  std::unique_ptr<model::Policy> policy;
  // Made at the first use that needs it (train, save, load, trainer()): a worker that only scores holds no
  // gradients, no optimizer state and no copy of the weights of its own.
  std::unique_ptr<train::Trainer> trainer_;
  train::TrainerConfig trainer_config;
  // The starting weights, fp32 in layout order, in host memory, read-only (shared with this process's other ranks).
  std::shared_ptr<const std::vector<float>> reference;
  // The same as the policy's compute weights, byte for byte in the policy's element order, made at the first reference
  // call that has to upload them (a GPU or fp64 policy with training state), in the device's staging memory
  // (page-locked for a GPU): later calls upload these bytes as they are, at the bus's speed.
  std::shared_ptr<void> reference_image;
  // The tokenizer and generation files of policy.model_name's folder as the worker started, which every checkpoint
  // and export carries, so that either can be served on its own.
  model::CompanionFiles companions;

  train::Trainer& trainer() {
    if (!trainer_) trainer_ = std::make_unique<train::Trainer>(trainer_config, *policy, *mesh, stop);
    return *trainer_;
  }

  // This dp rank's contiguous share [first, last) of n sequences.
  std::pair<size_t, size_t> share(size_t n) const {
    const size_t dp = static_cast<size_t>(mesh->dp()), d = static_cast<size_t>(mesh->dp_index());
    return {n * d / dp, n * (d + 1) / dp};
  }

  LogprobResult score(const std::vector<Sample>& samples, bool with_entropy) {
    return score(*policy, samples, with_entropy);
  }
  LogprobResult score(model::Policy& scorer, const std::vector<Sample>& samples, bool with_entropy) {
    check_samples(samples, model, config.policy.max_total_sequence_length, "get_logprobs");
    const auto [first, last] = share(samples.size());
    std::vector<int64_t> lengths;
    std::vector<std::vector<int32_t>> mine;
    for (size_t i = first; i < last; ++i) lengths.push_back(samples[i].length()), mine.push_back(samples[i].input_ids);
    // Every sequence's values at its place in one flat buffer of the whole batch, zero elsewhere: the sum over dp
    // gives every rank all of them exactly.
    std::vector<int64_t> start(samples.size() + 1, 0);
    for (size_t i = 0; i < samples.size(); ++i) start[i + 1] = start[i] + samples[i].length();
    std::vector<float> flat_lp(static_cast<size_t>(start.back()), 0.0f), flat_ent;
    if (with_entropy) flat_ent.assign(flat_lp.size(), 0.0f);
    bool stopped = false;
    if (!mine.empty()) {
      for (const Microbatch& mb : plan_microbatches(config, lengths, Pass::Score)) {
        if ((stopped = comm::any_stop_requested(mesh->cp_group(), stop))) break;
        model::TokenBatch batch;
        batch.packed = config.policy.sequence_packing.enabled;
        for (int64_t k : mb.sequences) batch.sequences.push_back(mine[static_cast<size_t>(k)]);
        model::TokenScores s = scorer.score(batch, /*for_backward=*/false, with_entropy);
        for (size_t k = 0; k < mb.sequences.size(); ++k) {
          const size_t at = static_cast<size_t>(start[first + static_cast<size_t>(mb.sequences[k])]);
          std::copy(s.logprobs[k].begin(), s.logprobs[k].end(), flat_lp.begin() + static_cast<ptrdiff_t>(at));
          if (with_entropy)
            std::copy(s.entropy[k].begin(), s.entropy[k].end(), flat_ent.begin() + static_cast<ptrdiff_t>(at));
        }
      }
    }
    comm::agree_to_stop(*world, stop, stopped, "scoring");
    all_reduce_sum(mesh->dp_group(), flat_lp);
    if (with_entropy) all_reduce_sum(mesh->dp_group(), flat_ent);
    LogprobResult out;
    const auto split = [&](const std::vector<float>& flat, std::vector<std::vector<float>>& to) {
      to.resize(samples.size());
      for (size_t i = 0; i < samples.size(); ++i) to[i].assign(flat.begin() + start[i], flat.begin() + start[i + 1]);
    };
    split(flat_lp, out.logprobs);
    if (with_entropy) split(flat_ent, out.entropy);
    return out;
  }

  // score(scorer, ...) for rows that stay where they are; see PolicyWorker::get_logprobs_into.
  void score_into(model::Policy& scorer, const TokenRowsBatch& batch, const TensorView& logprobs,
                  const TensorView& entropy, const char* what) {
    const TensorView& ids = batch.ids;
    RT_CHECK(ids.ndim == 2 && (ids.dtype == DType::I32 || ids.dtype == DType::I64), what,
             ": input_ids must be a [B, S] int32 or int64 array, not ", ids.shape_str());
    const int64_t B = ids.shape[0], C = ids.shape[1];
    RT_CHECK(B >= 1, what, ": the batch is empty");
    RT_CHECK(static_cast<int64_t>(batch.lengths.size()) == B, what, ": ", batch.lengths.size(), " lengths for ", B,
             " rows");
    const int64_t max_length = config.policy.max_total_sequence_length;
    for (int64_t i = 0; i < B; ++i) {
      const int64_t len = batch.lengths[static_cast<size_t>(i)];
      RT_CHECK(len >= 1 && len <= max_length, what, ": sample ", i, " has ", len,
               " tokens; policy.max_total_sequence_length allows 1 to ", max_length);
      RT_CHECK(len <= C, what, ": sample ", i, " has length ", len, " but its row holds ", C, " tokens");
    }
    for (const TensorView* v : {&logprobs, &entropy}) {
      if (v == &entropy && !entropy.data) continue;
      RT_CHECK(v->dtype == DType::F32 && v->ndim == 2 && v->shape[0] == B && v->shape[1] == C && v->is_contiguous(),
               what, ": results go into contiguous float32 [", B, ", ", C, "] arrays, not ", v->shape_str());
    }
    // The whole batch on every rank before any rank scores: a bad id fails every rank alike (as check_samples).
    const int64_t bad = device_ops(ids, what).first_outside(ids, batch.lengths, model.vocab);
    if (bad >= 0) {
      throw Error(cat(what, ": sample ", bad / C, " input_ids[", bad % C, "] = ", integer_at(ids, bad),
                      " is not a token id in [0, ", model.vocab, ")"));
    }
    const auto zero = [](const TensorView& v) {
      if (v.data) device_ops(v, "results").fill_async(v, 0.0, nullptr);
    };
    zero(logprobs), zero(entropy);
    const auto [first, last] = share(static_cast<size_t>(B));
    const std::vector<int64_t> lengths(batch.lengths.begin() + static_cast<ptrdiff_t>(first),
                                       batch.lengths.begin() + static_cast<ptrdiff_t>(last));
    bool stopped = false;
    if (!lengths.empty()) {
      for (const Microbatch& mb : plan_microbatches(config, lengths, Pass::Score)) {
        if ((stopped = comm::any_stop_requested(mesh->cp_group(), stop))) break;
        model::TokenRows rows;
        rows.ids = ids;
        rows.packed = config.policy.sequence_packing.enabled;
        for (int64_t k : mb.sequences) {
          rows.rows.push_back(static_cast<int64_t>(first) + k);
          rows.lengths.push_back(lengths[static_cast<size_t>(k)]);
        }
        scorer.score_into(rows, logprobs, entropy);
      }
    }
    comm::agree_to_stop(*world, stop, stopped, what);
    // Each dp rank wrote its own rows and zeros elsewhere: the sum gives every rank all of them exactly.
    all_reduce_sum(mesh->dp_group(), logprobs);
    if (entropy.data) all_reduce_sum(mesh->dp_group(), entropy);
    device_ops(logprobs, what).synchronize_stream(nullptr, what);
  }

  // score(scorer) with the reference weights. An fp32 CPU policy: a policy over the shared reference weights, read
  // in place (made per call, so that the buffers of its forward do not outlive the call). Otherwise the policy itself:
  // before any training state exists its weights are the reference ones; after, the reference weights are uploaded
  // for the call and the trained ones rewritten from the optimizer's master shards (the compute weights are their
  // rounding): the trained weights never cross to the host (only the first swap's reference image does, once), and
  // there is never a second copy of the weights on the GPU.
  template <typename Score>
  auto with_reference(const Score& score) {
    if (policy->device().is_cpu() && policy->dtype() == DType::F32) {
      const std::unique_ptr<model::Policy> ref = model::make_policy(model, reference, policy_options);
      return score(*ref);
    }
    if (!trainer_) return score(*policy);
    const TensorView w = policy->weights();
    if (!reference_image) {
      policy->set_params(*reference);  // once: fp32 -> the compute dtype, in the policy's order
      reference_image = device_ops(w, "reference weights").allocate_staging(w.nbytes());
      copy(contiguous_view(reference_image.get(), w.dtype, Device::cpu(), {w.numel()}), w);
    } else {
      copy(w, contiguous_view(reference_image.get(), w.dtype, Device::cpu(), {w.numel()}));  // one upload
    }
    try {
      auto out = score(*policy);
      trainer_->refresh_weights();
      return out;
    } catch (...) {
      // The scoring error is the one to report; a refresh that fails too leaves a communicator that has failed,
      // and the worker unusable, either way.
      try {
        trainer_->refresh_weights();
      } catch (...) {
      }
      throw;
    }
  }
};

std::shared_ptr<const std::vector<float>> StartingWeights::get(const Config& c, const model::ModelConfig& m) {
  const std::string key = is_builtin_model(c.policy.model_name) ? cat(c.policy.model_name, " seed ", c.train.seed)
                                                                : c.policy.model_name;
  const std::lock_guard<std::mutex> one_load(mu_);  // the other ranks wait for the first one's load
  if (auto held = held_[key].lock()) return held;
  auto loaded = std::make_shared<const std::vector<float>>(
      is_builtin_model(c.policy.model_name) ? model::random_params(model::ParamLayout(m), c.train.seed)
                                            : model::load_checkpoint_params(c.policy.model_name, m));
  held_[key] = loaded;
  return loaded;
}

PolicyWorker::PolicyWorker(const Config& config, comm::Communicator& world, StartingWeights* weights,
                           const StopRequest* stop)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  config.validate(ConfigUse::Worker);
  RT_CHECK(world.size() == config.parallel.world(), "parallel.dp x parallel.cp = ", config.parallel.dp, " x ",
           config.parallel.cp, " = ", config.parallel.world(), " ranks, but the world has ", world.size());
  RT_CHECK(config.device.is_cuda() == world.device().is_cuda(), "device = ", config.device.is_cuda() ? "cuda" : "cpu",
           ", but the world's communicator is on ", world.device().is_cuda() ? "cuda" : "cpu");
  s.config = config;
  s.world = &world;
  s.stop = stop;
  s.model = resolve_model_config(config.policy);
  config.validate_against(s.model);
  const train::TrainerConfig tcfg = trainer_config(config);
  train::validate(tcfg.adamw);
  train::validate(tcfg.schedule);

  s.mesh = std::make_unique<train::Mesh>(
      world, train::MeshShape{static_cast<int>(config.parallel.dp), static_cast<int>(config.parallel.cp)});
  s.policy_options = policy_options(config, s.model, world, s.mesh->cp_group());
  StartingWeights own;
  s.reference = (weights ? weights : &own)->get(config, s.model);
  s.policy = model::make_policy(s.model, s.reference, s.policy_options);
  if (!is_builtin_model(config.policy.model_name))
    s.companions = model::read_hf_companion_files(config.policy.model_name);
  s.trainer_config = tcfg;
}

PolicyWorker::~PolicyWorker() = default;

const model::ModelConfig& PolicyWorker::model_config() const { return state_->model; }
model::Policy& PolicyWorker::policy() { return *state_->policy; }
train::Trainer& PolicyWorker::trainer() { return state_->trainer(); }
int64_t PolicyWorker::steps_taken() const { return state_->trainer_ ? state_->trainer_->steps_taken() : 0; }
const train::Mesh& PolicyWorker::mesh() const { return *state_->mesh; }

LogprobResult PolicyWorker::get_logprobs(const std::vector<Sample>& samples, bool with_entropy) {
  return state_->score(samples, with_entropy);
}

LogprobResult PolicyWorker::get_reference_logprobs(const std::vector<Sample>& samples) {
  return state_->with_reference([&](model::Policy& scorer) { return state_->score(scorer, samples, false); });
}

void PolicyWorker::get_logprobs_into(const TokenRowsBatch& batch, const TensorView& logprobs,
                                     const TensorView& entropy) {
  state_->score_into(*state_->policy, batch, logprobs, entropy, "get_logprobs");
}

void PolicyWorker::get_reference_logprobs_into(const TokenRowsBatch& batch, const TensorView& logprobs) {
  state_->with_reference([&](model::Policy& scorer) {
    state_->score_into(scorer, batch, logprobs, {}, "get_reference_logprobs");
    return 0;
  });
}

namespace {

// A train batch holds exactly train_global_batch_size units: sequences, or (DPO) pairs of consecutive sequences.
void check_global_batch(int64_t sequences, const Config& c) {
  const bool dpo = c.loss_fn.type == LossType::Dpo;
  RT_CHECK(!dpo || sequences % 2 == 0, "train: a DPO batch holds pairs (chosen, rejected); got ", sequences,
           " sequences");
  const int64_t units = sequences / (dpo ? 2 : 1);
  RT_CHECK(units == c.policy.train_global_batch_size, "train: the batch holds ", units, dpo ? " pairs" : " sequences",
           "; policy.train_global_batch_size = ", c.policy.train_global_batch_size);
}

}  // namespace

TrainResult PolicyWorker::train(const std::vector<Sample>& samples) {
  State& s = *state_;
  const Config& c = s.config;
  const auto t0 = SteadyClock::now();
  check_samples(samples, s.model, c.policy.max_total_sequence_length, "train");
  const bool dpo = c.loss_fn.type == LossType::Dpo, pg = c.loss_fn.type == LossType::ClippedPg;
  check_global_batch(static_cast<int64_t>(samples.size()), c);

  train::TrainBatch batch;
  for (const Sample& x : samples) {
    batch.sequences.push_back(x.input_ids);
    batch.token_mask.push_back(x.token_mask.empty() ? std::vector<uint8_t>(x.input_ids.size(), 1)
                                                    : to_mask(x.token_mask));
    batch.sample_mask.push_back(x.sample_mask != 0.0f);
  }
  // Logprobs the loss reads, from the samples, or computed here when a sample lacks them.
  const auto gather = [&](std::vector<float> Sample::*field, bool reference) {
    std::vector<std::vector<float>> to(samples.size());
    std::vector<Sample> missing;
    std::vector<size_t> where;
    for (size_t i = 0; i < samples.size(); ++i) {
      if ((samples[i].*field).empty())
        missing.push_back(samples[i]), where.push_back(i);
      else
        to[i] = samples[i].*field;
    }
    if (!missing.empty()) {
      LogprobResult r = reference ? get_reference_logprobs(missing) : s.score(missing, false);
      for (size_t k = 0; k < where.size(); ++k) to[where[k]] = std::move(r.logprobs[k]);
    }
    return to;
  };
  if (pg) {
    for (size_t i = 0; i < samples.size(); ++i)
      RT_CHECK(!samples[i].advantages.empty(), "train: loss_fn.type clipped_pg needs advantages; sample ", i,
               " has none");
    for (const Sample& x : samples) batch.advantages.push_back(x.advantages);
    batch.prev_logprobs = gather(&Sample::prev_logprobs, false);
    if (c.loss_fn.reference_policy_kl_penalty != 0.0) batch.ref_logprobs = gather(&Sample::reference_logprobs, true);
    if (c.loss_fn.use_importance_sampling_correction) {
      for (size_t i = 0; i < samples.size(); ++i)
        RT_CHECK(!samples[i].generation_logprobs.empty(),
                 "train: loss_fn.use_importance_sampling_correction needs generation_logprobs; sample ", i,
                 " has none");
      for (const Sample& x : samples) batch.gen_logprobs.push_back(x.generation_logprobs);
    }
  }
  if (dpo) batch.ref_logprobs = gather(&Sample::reference_logprobs, true);

  TrainResult out;
  out.step = s.trainer().step(batch);
  synchronize(s.policy->device());
  out.seconds = seconds_since(t0);
  int64_t tokens = 0;
  for (const Sample& x : samples) tokens += x.length();
  out.tokens_per_second = out.seconds > 0 ? static_cast<double>(tokens) / out.seconds : 0.0;
  return out;
}

TrainResult PolicyWorker::train_rows(const TrainRowsBatch& batch) {
  State& s = *state_;
  const Config& c = s.config;
  const auto t0 = SteadyClock::now();
  const TensorView& ids = batch.tokens.ids;
  const Device dev = s.policy->device();
  RT_CHECK(dev.is_cuda() && ids.device == dev, "train: a batch of device rows needs the policy and input_ids on one ",
           "GPU; the policy is on ", device_name(dev), ", input_ids on ", device_name(ids.device));
  check_row_lengths(ids, batch.tokens.lengths);
  const bool dpo = c.loss_fn.type == LossType::Dpo, pg = c.loss_fn.type == LossType::ClippedPg;
  const int64_t B = ids.shape[0], C = ids.shape[1];
  check_global_batch(B, c);
  int64_t tokens = 0;
  for (int64_t i = 0; i < B; ++i) {
    const int64_t len = batch.tokens.lengths[static_cast<size_t>(i)];
    RT_CHECK(len >= 1 && len <= c.policy.max_total_sequence_length, "train: sample ", i, " has ", len,
             " tokens; policy.max_total_sequence_length allows 1 to ", c.policy.max_total_sequence_length);
    tokens += len;
  }
  RT_CHECK(!pg || batch.advantages.data, "train: loss_fn.type clipped_pg needs advantages");
  RT_CHECK(!(pg && c.loss_fn.use_importance_sampling_correction) || batch.generation_logprobs.data,
           "train: loss_fn.use_importance_sampling_correction needs generation_logprobs");

  train::TrainRows rows;
  rows.ids = ids;
  rows.lengths = batch.tokens.lengths;
  rows.token_mask = batch.token_mask;
  rows.sample_mask = batch.sample_mask;
  // Logprobs the loss reads, from the batch, or scored here into device memory.
  Tensor prev, ref;
  const auto scored = [&](const TensorView& given, Tensor& made, bool reference) {
    if (given.data) return given;
    made = Tensor::empty({B, C}, DType::F32, dev);
    if (reference)
      get_reference_logprobs_into(batch.tokens, made.view());
    else
      get_logprobs_into(batch.tokens, made.view());
    return made.view();
  };
  if (pg) {
    rows.advantages = batch.advantages;
    rows.prev_logprobs = scored(batch.prev_logprobs, prev, false);
    if (c.loss_fn.reference_policy_kl_penalty != 0.0) rows.ref_logprobs = scored(batch.reference_logprobs, ref, true);
    if (c.loss_fn.use_importance_sampling_correction) rows.gen_logprobs = batch.generation_logprobs;
  }
  if (dpo) rows.ref_logprobs = scored(batch.reference_logprobs, ref, true);

  TrainResult out;
  out.step = s.trainer().step(rows);
  synchronize(dev);
  out.seconds = seconds_since(t0);
  out.tokens_per_second = out.seconds > 0 ? static_cast<double>(tokens) / out.seconds : 0.0;
  return out;
}

void PolicyWorker::save(const fs::path& dir, const train::TrainingProgress& position) {
  train::save_training_checkpoint(dir, state_->trainer(), position, {.companions = state_->companions});
}

train::TrainingProgress PolicyWorker::load(const fs::path& dir) {
  return train::load_training_checkpoint(dir, state_->trainer());
}

namespace {

// Marks an export's staging folder, and an export that is being replaced, as ours to remove: a folder of that name
// without it (a user's export saved as Y.exporting) is never removed.
constexpr const char* kExportMarker = ".ringtrain-exporting";

// Left in every finished export: the tokenizer and generation files an export copies may be replaced only in a
// folder that an export wrote, never in a model folder of the user's that holds them.
constexpr const char* kFinishedExport = ".ringtrain-export";

// What an export writes: an existing folder is replaced only when it holds nothing else (an earlier export, a
// leftover of one, or an empty folder), so that no user file, and no checkpoint, is ever deleted by an export. A
// folder without kFinishedExport (a Hugging Face folder written by another tool) may hold config.json and
// model.safetensors only.
// A leftover may also hold the temporary names its files were being written under.
enum class ExportFolder : uint8_t { Destination, Leftover };
void check_replaceable_export(const fs::path& p, ExportFolder kind) {
  if (!model::exists_no_follow(p)) return;
  const bool leftover = kind == ExportFolder::Leftover;
  const char* what = leftover ? "remove" : "replace";
  RT_CHECK(!fs::is_symlink(p), "export: ", p.string(), " is a symbolic link (to ", fs::read_symlink(p).string(),
           "); refusing to ", what, " it (export to the folder itself)");
  RT_CHECK(fs::symlink_status(p).type() == fs::file_type::directory, "export: ", p.string(),
           " exists and is not a directory; refusing to ", what, " it");
  const bool finished = fs::symlink_status(p / kFinishedExport).type() == fs::file_type::regular;
  const auto ours = [&](const std::string& name) {
    const std::vector<std::string>& companions = model::hf_companion_files();
    return name == "config.json" || name == "model.safetensors" || name == kFinishedExport ||
           ((finished || leftover) && std::find(companions.begin(), companions.end(), name) != companions.end());
  };
  for (const fs::directory_entry& e : fs::directory_iterator(p)) {
    const std::string name = e.path().filename().string();
    const size_t tmp = name.find(".tmp.");  // write_file_atomic's temporary ".NAME.tmp.PID"
    const bool temporary =
        leftover && name.starts_with('.') && tmp != std::string::npos && ours(name.substr(1, tmp - 1));
    const bool written = ours(name) || name == kExportMarker || temporary;
    RT_CHECK(written && e.symlink_status().type() == fs::file_type::regular, "export: ", p.string(), " holds ",
             e.path().string(), written ? ", not a regular file" : ", which an export does not write",
             finished || leftover ? "" : cat(" (or writes only beside ", kFinishedExport, ", in a folder of its own)"),
             "; refusing to ", what, " it (export into a new or empty folder, or over an earlier export)");
  }
  RT_CHECK(!leftover || fs::is_empty(p) || fs::symlink_status(p / kExportMarker).type() == fs::file_type::regular,
           "export: refusing to remove ", p.string(), ": it is an export, but not a leftover of one (no ",
           kExportMarker, "); move it away if it is yours");
}

// A leftover export folder (checked) removed with its marker kept to the last, so that a kill at any point leaves a
// folder that is still a leftover: marked, or empty.
void remove_export_leftover(const fs::path& p) {
  if (!model::exists_no_follow(p)) return;
  check_replaceable_export(p, ExportFolder::Leftover);
  std::error_code failed;
  for (const fs::directory_entry& e : fs::directory_iterator(p, failed))
    if (e.path().filename() != kExportMarker && !failed) fs::remove(e.path(), failed);
  if (!failed) fs::remove(p / kExportMarker, failed);
  if (!failed) fs::remove(p, failed);
  if (failed)
    throw Error(cat("export: cannot remove ", p.string(), ", left by an earlier export (", failed.message(),
                    "); remove it yourself, or export elsewhere"));
}

}  // namespace

void write_hf_folder(const fs::path& dir, const model::ModelConfig& config, const std::vector<float>& values,
                     const model::CompanionFiles& companions) {
  RT_CHECK(!dir.empty(), "export: the output folder is empty");
  fs::path dest = dir.lexically_normal();
  if (!dest.has_filename()) dest = dest.parent_path();  // "out/" is the folder out, never what a link there points to
  const fs::path old = sibling(dest, ".replaced");
  const std::string what = cat("export ", dest.string());
  with_context(what, "export", [&] {
    check_replaceable_export(dest, ExportFolder::Destination);
    if (model::exists_no_follow(dest)) {
      model::check_removable(dest, what);
      check_replaceable_export(old, ExportFolder::Leftover);
    }
    model::StagingFolder staging(sibling(dest, ".exporting"), kExportMarker, what, remove_export_leftover);
    const fs::path& tmp = staging.path();
    model::write_config(tmp, config);
    model::write_safetensors(tmp / "model.safetensors",
                             model::params_to_tensors(model::ParamLayout(config), values.data(), config.dtype));
    model::write_hf_companion_files(tmp, companions);
    model::write_file_atomic(tmp / kFinishedExport, "");
    staging.publish(dest, old, [](const fs::path& p) { check_replaceable_export(p, ExportFolder::Destination); });
  });
}

void PolicyWorker::export_hf(const fs::path& dir) {
  State& s = *state_;
  comm::all_or_none(*s.world, "export", [&] {
    if (s.world->rank() != 0) return;  // every rank holds all weights
    model::ModelConfig config = s.model;
    config.dtype = s.policy->dtype() == DType::BF16 ? DType::BF16 : DType::F32;
    write_hf_folder(dir, config, s.policy->params(), s.companions);
  });
}

std::vector<RefitEntry> PolicyWorker::refit_info() const {
  const model::Policy& p = *state_->policy;
  const DType dtype = p.dtype() == DType::F64 ? DType::F32 : p.dtype();
  std::vector<RefitEntry> out;
  const model::ParamLayout& layout = p.layout();
  for (const model::ParamSpec& spec : layout.specs()) {
    if (spec.name == "lm_head.weight" && layout.lm_head == layout.embed) continue;  // tied: served by the embedding
    out.push_back({spec.name, spec.shape, dtype});
  }
  return out;
}

}  // namespace ringtrain::worker
