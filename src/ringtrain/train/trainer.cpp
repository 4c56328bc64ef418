#include "ringtrain/train/trainer.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <span>

#include "ringtrain/comm/agreed.h"
#include "ringtrain/core/error.h"
#include "ringtrain/train/device_optimizer.h"
#include "ringtrain/train/trainer_detail.h"

namespace ringtrain::train {
namespace detail {

void all_reduce_sum(comm::Communicator& group, std::vector<double>& values) {
  if (values.empty()) return;
  const int64_t n = static_cast<int64_t>(values.size());
  const TensorView host = contiguous_view(values.data(), DType::F64, Device::cpu(), {n});
  Tensor buf = Tensor::empty({n}, DType::F64, group.device());
  copy(buf, host);
  group.all_reduce(buf.data(), static_cast<size_t>(n), DType::F64, comm::ReduceOp::Sum);
  copy(host, buf);
}

std::vector<std::vector<int64_t>> plan_micros(const TrainerConfig& cfg, const std::vector<int64_t>& all_lengths,
                                              int64_t first, int64_t last) {
  std::vector<std::vector<int64_t>> out;
  if (!cfg.plan) {
    for (int64_t s = first; s < last; s += cfg.micro_batch_size) {
      out.emplace_back();
      for (int64_t i = s; i < std::min(s + cfg.micro_batch_size, last); ++i) out.back().push_back(i);
    }
    return out;
  }
  if (first == last) return out;
  std::vector<int64_t> lengths;
  for (int64_t i = first; i < last; ++i) lengths.push_back(all_lengths[static_cast<size_t>(i)]);
  out = cfg.plan(lengths);
  const bool dpo = cfg.loss.kind == LossKind::DPO;
  std::vector<bool> seen(lengths.size(), false);
  for (size_t m = 0; m < out.size(); ++m) {
    RT_CHECK(!out[m].empty(), "trainer: the microbatch plan's microbatch ", m, " is empty");
    int64_t before = -1;
    for (size_t k = 0; k < out[m].size(); ++k) {
      const int64_t i = out[m][k];
      RT_CHECK(i >= 0 && i < last - first && !seen[i], "trainer: the microbatch plan names sequence ", i,
               " of ", last - first, " twice or out of range");
      // DPO rows pair up as (chosen, rejected) inside a microbatch: the part starts at an even index.
      RT_CHECK(!dpo || (k % 2 == 0 ? i % 2 == 0 : i == before + 1),
               "trainer: the microbatch plan splits a DPO pair (sequence ", i, ")");
      seen[i] = true;
      before = i;
      out[m][k] = first + i;
    }
  }
  for (size_t i = 0; i < seen.size(); ++i)
    RT_CHECK(seen[i], "trainer: the microbatch plan leaves out sequence ", i, " of this rank's ", seen.size());
  return out;
}

std::pair<int64_t, int64_t> dp_part(int64_t sequences, LossKind kind, const Mesh& mesh) {
  const int64_t unit = kind == LossKind::DPO ? 2 : 1;
  const int64_t units = sequences / unit, d = mesh.dp_index(), dp = mesh.dp();
  return {units * d / dp * unit, units * (d + 1) / dp * unit};
}

}  // namespace detail

namespace {

using detail::all_reduce_sum;

// A 1-D view of a flat buffer (the policy's are contiguous).
TensorView flat(const TensorView& v, const char* what) {
  RT_CHECK(v.is_contiguous(), "trainer: the policy's ", what, " buffer is not contiguous: ", v.shape_str());
  return contiguous_view(v.data, v.dtype, v.device, {v.numel()});
}

// The elements of a flat buffer of n that no Hugging Face tensor covers (alignment gaps of the GPU layout), as
// [begin, end) ranges.
std::vector<std::pair<int64_t, int64_t>> uncovered(const model::Policy& policy, int64_t n) {
  std::vector<std::pair<int64_t, int64_t>> tensors;
  for (size_t i = 0; i < policy.layout().specs().size(); ++i)
    tensors.emplace_back(policy.flat_offsets()[i], policy.flat_offsets()[i] + policy.layout().specs()[i].numel);
  std::sort(tensors.begin(), tensors.end());
  std::vector<std::pair<int64_t, int64_t>> gaps;
  int64_t at = 0;
  for (const auto& [begin, end] : tensors) {
    if (begin > at) gaps.emplace_back(at, begin);
    at = std::max(at, end);
  }
  if (at < n) gaps.emplace_back(at, n);
  return gaps;
}

char* byte_at(const TensorView& v, int64_t element) {
  return static_cast<char*>(v.data) + static_cast<size_t>(element) * dtype_size(v.dtype);
}

// One microbatch padded to its longest sequence, row-major [batch, seq], in the losses' form.
struct Micro {
  std::vector<int64_t> index;  // its sequences' indices in the global batch, in row order
  int64_t batch = 0, seq = 0;
  model::TokenBatch tokens;
  std::vector<uint8_t> token_mask, sample_mask;
  std::vector<double> advantages, prev, ref, gen;

  TokenMasks masks() const { return {batch, seq, token_mask, sample_mask}; }
};

// Pads per-sequence values of the sequences `index` to [batch * seq]; empty stays empty.
std::vector<double> pad(const std::vector<std::vector<float>>& per_seq, const std::vector<int64_t>& index,
                        int64_t seq) {
  if (per_seq.empty()) return {};
  std::vector<double> out(index.size() * static_cast<size_t>(seq), 0.0);
  for (size_t b = 0; b < index.size(); ++b) {
    const std::vector<float>& v = per_seq[static_cast<size_t>(index[b])];
    for (size_t p = 0; p < v.size(); ++p) out[b * static_cast<size_t>(seq) + p] = v[p];
  }
  return out;
}

Micro make_micro(const TrainBatch& tb, std::vector<int64_t> index, bool packed) {
  Micro m;
  m.index = std::move(index);
  m.batch = static_cast<int64_t>(m.index.size());
  m.tokens.packed = packed;
  for (int64_t i : m.index) {
    m.tokens.sequences.push_back(tb.sequences[i]);
    m.seq = std::max<int64_t>(m.seq, static_cast<int64_t>(tb.sequences[i].size()));
  }
  m.token_mask.assign(static_cast<size_t>(m.batch * m.seq), 0);
  m.sample_mask.assign(static_cast<size_t>(m.batch), 1);
  for (int64_t b = 0; b < m.batch; ++b) {
    const int64_t i = m.index[b];
    const size_t len = tb.sequences[i].size();
    for (size_t p = 0; p < len; ++p) m.token_mask[b * m.seq + p] = tb.token_mask.empty() ? 1 : tb.token_mask[i][p];
    if (!tb.sample_mask.empty()) m.sample_mask[b] = tb.sample_mask[i];
  }
  m.advantages = pad(tb.advantages, m.index, m.seq);
  m.prev = pad(tb.prev_logprobs, m.index, m.seq);
  m.ref = pad(tb.ref_logprobs, m.index, m.seq);
  m.gen = pad(tb.gen_logprobs, m.index, m.seq);
  return m;
}

void check_per_token(const TrainBatch& tb, const std::vector<std::vector<float>>& field, const char* name,
                     bool required) {
  RT_CHECK(!required || !field.empty(), "train batch: this loss needs ", name);
  if (field.empty()) return;
  RT_CHECK(field.size() == tb.sequences.size(), "train batch: ", name, " has ", field.size(), " sequences, the batch ",
           tb.sequences.size());
  for (size_t i = 0; i < field.size(); ++i)
    RT_CHECK(field[i].size() == tb.sequences[i].size(), "train batch: ", name, "[", i, "] has ", field[i].size(),
             " entries for a sequence of ", tb.sequences[i].size(), " tokens");
}

void validate_batch(const TrainBatch& tb, const LossConfig& loss) {
  const size_t n = tb.sequences.size();
  RT_CHECK(n > 0, "train batch: no sequences");
  for (size_t i = 0; i < n; ++i) RT_CHECK(!tb.sequences[i].empty(), "train batch: sequence ", i, " is empty");
  if (!tb.token_mask.empty()) {
    RT_CHECK(tb.token_mask.size() == n, "train batch: token_mask has ", tb.token_mask.size(), " sequences, the batch ",
             n);
    for (size_t i = 0; i < n; ++i)
      RT_CHECK(tb.token_mask[i].size() == tb.sequences[i].size(), "train batch: token_mask[", i, "] has ",
               tb.token_mask[i].size(), " entries for a sequence of ", tb.sequences[i].size(), " tokens");
  }
  RT_CHECK(tb.sample_mask.empty() || tb.sample_mask.size() == n, "train batch: sample_mask has ",
           tb.sample_mask.size(), " entries, the batch ", n, " sequences");
  const bool pg = loss.kind == LossKind::ClippedPG, dpo = loss.kind == LossKind::DPO;
  check_per_token(tb, tb.advantages, "advantages", pg);
  check_per_token(tb, tb.prev_logprobs, "prev_logprobs", pg);
  check_per_token(tb, tb.ref_logprobs, "ref_logprobs", dpo || (pg && loss.pg.kl_beta != 0));
  check_per_token(tb, tb.gen_logprobs, "gen_logprobs", false);
  RT_CHECK(!dpo || n % 2 == 0, "train batch: DPO needs chosen/rejected pairs, got ", n, " sequences");
  if (dpo && !tb.sample_mask.empty())
    for (size_t i = 0; i < n; i += 2)
      RT_CHECK(tb.sample_mask[i] == tb.sample_mask[i + 1], "train batch: DPO pair ", i / 2, " (sequences ", i, " and ",
               i + 1, ") has sample_mask ", int(tb.sample_mask[i]), " on the chosen sequence but ",
               int(tb.sample_mask[i + 1]), " on the rejected one");
}

std::vector<std::vector<float>> unpad(const std::vector<double>& padded, const Micro& m) {
  std::vector<std::vector<float>> out(static_cast<size_t>(m.batch));
  for (int64_t b = 0; b < m.batch; ++b) {
    const size_t len = m.tokens.sequences[b].size();
    out[b].resize(len);
    for (size_t p = 0; p < len; ++p) out[b][p] = static_cast<float>(padded[b * m.seq + p]);
  }
  return out;
}

std::vector<double> pad_scores(const std::vector<std::vector<float>>& rows, const Micro& m) {
  std::vector<double> out(static_cast<size_t>(m.batch * m.seq), 0.0);
  RT_CHECK(static_cast<int64_t>(rows.size()) == m.batch, "trainer: the policy scored ", rows.size(),
           " sequences of ", m.batch);
  for (int64_t b = 0; b < m.batch; ++b) {
    RT_CHECK(rows[b].size() == m.tokens.sequences[b].size(), "trainer: the policy scored ", rows[b].size(),
             " tokens of a sequence of ", m.tokens.sequences[b].size());
    for (size_t p = 0; p < rows[b].size(); ++p) out[b * m.seq + p] = rows[b][p];
  }
  return out;
}

template <typename T>
std::span<const T> cspan(const std::vector<T>& v) {
  return {v.data(), v.size()};
}

// The loss of one microbatch; grad gets d(loss)/d(logprob) in [batch * seq].
LossResult micro_loss(const LossConfig& cfg, const Micro& m, const std::vector<double>& logprobs,
                      const std::vector<double>& entropy, const ValidCounts& global, const DPOCounts& global_pairs,
                      std::vector<double>& grad) {
  grad.assign(static_cast<size_t>(m.batch * m.seq), 0.0);
  const std::span<double> g(grad.data(), grad.size());
  switch (cfg.kind) {
    case LossKind::NLL: return nll_loss<double>(m.masks(), cspan(logprobs), global, g);
    case LossKind::ClippedPG: {
      ClippedPGInputs<double> in;
      in.logprobs = cspan(logprobs);
      in.prev_logprobs = cspan(m.prev);
      in.advantages = cspan(m.advantages);
      in.ref_logprobs = cspan(m.ref);
      in.gen_logprobs = cspan(m.gen);
      in.entropy = cspan(entropy);
      return clipped_pg_loss<double>(m.masks(), in, cfg.pg, global, g);
    }
    case LossKind::DPO: return dpo_loss<double>(m.masks(), cspan(logprobs), cspan(m.ref), cfg.dpo, global_pairs, g);
  }
  throw Error("trainer: unknown loss kind");
}

// The gradient of the microbatch's loss token by token, for the token-local losses (NLL, clipped PG); none for DPO.
std::optional<TokenLocalGradient> token_local_gradient(const LossConfig& cfg, const Micro& m,
                                                       const ValidCounts& global) {
  switch (cfg.kind) {
    case LossKind::NLL: return TokenLocalGradient::nll(m.masks(), global);
    case LossKind::ClippedPG: {
      ClippedPGInputs<double> in;
      in.prev_logprobs = cspan(m.prev);
      in.advantages = cspan(m.advantages);
      in.ref_logprobs = cspan(m.ref);
      in.gen_logprobs = cspan(m.gen);
      return TokenLocalGradient::clipped_pg<double>(m.masks(), in, cfg.pg, global);
    }
    case LossKind::DPO: return std::nullopt;
  }
  throw Error("trainer: unknown loss kind");
}

}  // namespace

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::Forward: return "fwd+logprobs";
    case Phase::ForwardBackward: return "fwd+logprobs+bwd";
    case Phase::Loss: return "loss";
    case Phase::Backward: return "backward";
    case Phase::ReduceScatter: return "reduce-scatter";
    case Phase::NormClip: return "norm/clip";
    case Phase::AdamW: return "adamw";
    case Phase::AllGather: return "all-gather";
  }
  return "?";
}

std::pair<int64_t, int64_t> Trainer::shard_range(int64_t n, int world, int rank) {
  const int64_t part = n / world;
  const int64_t begin = part * rank;
  return {begin, rank == world - 1 ? n : begin + part};
}

Trainer::Trainer(const TrainerConfig& cfg, model::Policy& policy, const Mesh& mesh, const StopRequest* stop)
    : cfg_(cfg), policy_(&policy), mesh_(&mesh), stop_(stop), schedule_(cfg.schedule) {
  validate(cfg.adamw);
  RT_CHECK(cfg.micro_batch_size >= 1, "trainer: micro_batch_size must be >= 1, got ", cfg.micro_batch_size);
  RT_CHECK(cfg.loss.kind != LossKind::DPO || cfg.micro_batch_size % 2 == 0,
           "trainer: DPO keeps pairs together: micro_batch_size must be even, got ", cfg.micro_batch_size);
  const TensorView w = flat(policy.weights(), "weights"), g = flat(policy.grads(), "gradient");
  RT_CHECK(w.numel() == g.numel(), "trainer: the policy has ", w.numel(), " weights but ", g.numel(), " gradients");
  RT_CHECK(w.device == mesh.world().device(), "trainer: the policy is on ", device_name(w.device),
           " but the communicators on ", device_name(mesh.world().device()));
  const DType master = g.dtype;
  RT_CHECK(master == DType::F32 || master == DType::F64, "trainer: gradients must be fp32 or fp64, got ",
           dtype_name(master));
  if (!w.device.is_cpu()) {
    RT_CHECK(device_optimizer_kernels() != nullptr, "trainer: this build has no optimizer kernels for ",
             device_name(w.device));
    RT_CHECK(master == DType::F32 && w.dtype == DType::BF16, "trainer: on ", device_name(w.device),
             " the optimizer takes fp32 gradients and bf16 weights, got ", dtype_name(master), " and ",
             dtype_name(w.dtype));
  }
  const auto [begin, end] = shard_range(w.numel(), mesh.world().size(), mesh.world().rank());
  shard_.begin = begin, shard_.end = end;
  const int64_t n = end - begin;
  shard_.master = Tensor::empty({n}, master, w.device);
  shard_.exp_avg = Tensor::zeros({n}, master, w.device);
  shard_.exp_avg_sq = Tensor::zeros({n}, master, w.device);
  if (n > 0) copy(shard_.master, w.slice(0, begin, n));
  // Gaps between the tensors (the GPU layout aligns groups) are never written by a backward: zero once in the
  // gradient buffer (so the norm never reads garbage, and the reductions keep them zero) and in the master shard.
  for (const auto& [gap_begin, gap_end] : uncovered(policy, w.numel())) {
    fill(g.slice(0, gap_begin, gap_end - gap_begin), 0.0);
    const int64_t lo = std::max(gap_begin, begin), hi = std::min(gap_end, end);
    if (lo < hi) fill(shard_.master.view().slice(0, lo - begin, hi - lo), 0.0);
  }
  norm_result_ = Tensor::empty({1}, DType::F64, w.device);
}

void Trainer::restore_counters(int64_t steps, int64_t optimizer_steps, int64_t schedule_position) {
  RT_CHECK(steps >= 0 && optimizer_steps >= 0 && optimizer_steps <= steps,
           "trainer: bad counters: steps ", steps, ", optimizer steps ", optimizer_steps);
  steps_ = steps;
  completed_ = optimizer_steps;
  schedule_.set_position(schedule_position);
}

void Trainer::all_gather_weights() {
  comm::Communicator& world = mesh_->world();
  const TensorView w = flat(policy_->weights(), "weights");
  if (world.size() == 1) return;
  const int64_t part = w.numel() / world.size(), tail_begin = part * world.size();
  if (part > 0) world.all_gather(byte_at(w, part * world.rank()), w.data, static_cast<size_t>(part), w.dtype);
  if (tail_begin < w.numel())
    world.broadcast(byte_at(w, tail_begin), static_cast<size_t>(w.numel() - tail_begin), w.dtype, world.size() - 1);
}

void Trainer::refresh_weights() {
  const TensorView w = flat(policy_->weights(), "weights");
  const int64_t n = shard_.end - shard_.begin;
  if (n > 0) copy(w.slice(0, shard_.begin, n), shard_.master);
  all_gather_weights();
}

StepResult Trainer::step(const TrainBatch& batch, const PhaseHook& on_phase_end) {
  const auto mark = [&](Phase p) {
    if (on_phase_end) on_phase_end(p);
  };
  StepResult out;
  out.step = steps_ + 1;
  out.lr = schedule_.lr();

  // 1. The batch checked; this dp rank's contiguous part (in whole DPO pairs), its microbatches and their valid
  // counts. A part's masks can fail on its ranks only: every rank raises the error together, and stays in step.
  std::vector<Micro> micros;
  std::vector<double> counts(4, 0.0);  // tokens, sequences, DPO pairs, DPO chosen tokens
  comm::all_or_none(mesh_->world(), "train step", [&] {
    validate_batch(batch, cfg_.loss);
    const auto [first, last] = detail::dp_part(static_cast<int64_t>(batch.sequences.size()), cfg_.loss.kind, *mesh_);
    std::vector<int64_t> lengths;
    for (const std::vector<int32_t>& s : batch.sequences) lengths.push_back(static_cast<int64_t>(s.size()));
    for (std::vector<int64_t>& index : detail::plan_micros(cfg_, lengths, first, last))
      micros.push_back(make_micro(batch, std::move(index), cfg_.packed));
    for (const Micro& m : micros) {
      const ValidCounts c = count_valid(m.masks());
      counts[0] += c.tokens, counts[1] += c.sequences;
      if (cfg_.loss.kind == LossKind::DPO) {
        const DPOCounts p = count_dpo_pairs(m.masks());
        counts[2] += p.pairs, counts[3] += p.chosen_tokens;
      }
    }
  });

  // 2. Global counts over dp (the ranks of a cp group hold the same sequences).
  all_reduce_sum(mesh_->dp_group(), counts);
  const ValidCounts global{counts[0], counts[1]};
  const DPOCounts global_pairs{counts[2], counts[3]};
  out.valid_tokens = global.tokens, out.valid_sequences = global.sequences;

  // 3. Microbatches: score, loss, backward. No collective spans dp ranks here, so a rank with fewer microbatches
  // needs no empty ones; a rank with none still evaluates the loss on nothing to learn the metrics' names.
  policy_->zero_grads();
  norm_beside_backward_ = false;
  const bool entropy = cfg_.loss.kind == LossKind::ClippedPG;
  std::vector<MetricSum> metric_sums;
  double loss_sum = 0;
  const auto add_metrics = [&](const LossResult& r) {
    if (metric_sums.empty()) {
      metric_sums = r.metrics;
      return;
    }
    RT_CHECK(metric_sums.size() == r.metrics.size(), "trainer: the loss's metrics changed between microbatches");
    for (size_t i = 0; i < r.metrics.size(); ++i) {
      metric_sums[i].sum += r.metrics[i].sum;
      metric_sums[i].count += r.metrics[i].count;
    }
  };
  std::vector<double> grad;
  bool stopped = false;
  for (const Micro& m : micros) {
    if ((stopped = comm::any_stop_requested(mesh_->cp_group(), stop_))) break;
    if (&m == &micros.back()) ask_norm_beside_last_backward();
    // A token-local loss's gradient is applied inside the forward; the loss below then gives the same gradient
    // again (unused) with the value and the metrics.
    const std::optional<TokenLocalGradient> local_grad = token_local_gradient(cfg_.loss, m, global);
    model::TokenScores scores;
    if (local_grad) {
      scores = policy_->score_and_backward(
          m.tokens, [&](int64_t b, int64_t p, float logprob) { return (*local_grad)(b, p, logprob); }, entropy);
      mark(Phase::ForwardBackward);
    } else {
      scores = policy_->score(m.tokens, true, entropy);
      mark(Phase::Forward);
    }
    const std::vector<double> logprobs = pad_scores(scores.logprobs, m);
    const std::vector<double> ent = entropy ? pad_scores(scores.entropy, m) : std::vector<double>{};
    const LossResult r = micro_loss(cfg_.loss, m, logprobs, ent, global, global_pairs, grad);
    out.microbatch_losses.push_back(r.loss);
    loss_sum += r.loss;
    add_metrics(r);
    mark(Phase::Loss);
    if (!local_grad) {
      policy_->backward(unpad(grad, m));
      mark(Phase::Backward);
    }
  }
  comm::agree_to_stop(mesh_->world(), stop_, stopped, cat("train step ", out.step));
  if (micros.empty()) {
    Micro none;
    const std::vector<double> nothing;
    add_metrics(micro_loss(cfg_.loss, none, nothing, nothing, global, global_pairs, grad));
  }

  // The loss and the metrics over dp.
  std::vector<double> sums{loss_sum};
  for (const MetricSum& s : metric_sums) sums.push_back(s.sum), sums.push_back(s.count);
  all_reduce_sum(mesh_->dp_group(), sums);
  out.loss = out.valid_tokens > 0 ? sums[0] : kNoValue;  // a loss over nothing is not 0
  for (size_t i = 0; i < metric_sums.size(); ++i) {
    const double sum = sums[1 + 2 * i], count = sums[2 + 2 * i];
    out.metrics.push_back({metric_sums[i].name, count > 0 ? sum / count : kNoValue, count});
  }

  apply_gradients(out, on_phase_end);
  return out;
}

void Trainer::ask_norm_beside_last_backward() {
  norm_beside_backward_ =
      mesh_->world().size() == 1 && policy_->sum_grad_squares_in_next_backward(norm_result_.ptr<double>());
}

void Trainer::apply_gradients(StepResult& out, const PhaseHook& on_phase_end) {
  const auto mark = [&](Phase p) {
    if (on_phase_end) on_phase_end(p);
  };
  comm::Communicator& world = mesh_->world();
  // 4. Gradients summed over all dp · cp ranks into this rank's shard, in place.
  const TensorView g = flat(policy_->grads(), "gradient");
  const int64_t part = g.numel() / world.size(), tail_begin = part * world.size();
  if (part > 0 && world.size() > 1)
    world.reduce_scatter(g.data, byte_at(g, part * world.rank()), static_cast<size_t>(part), g.dtype,
                         comm::ReduceOp::Sum);
  if (tail_begin < g.numel() && world.size() > 1)
    world.all_reduce(byte_at(g, tail_begin), static_cast<size_t>(g.numel() - tail_begin), g.dtype,
                     comm::ReduceOp::Sum);
  mark(Phase::ReduceScatter);

  // 5. Global norm, skip decision and clip coefficient, the same on every rank.
  const int64_t n = shard_.end - shard_.begin;
  const TensorView g_shard = g.slice(0, shard_.begin, n);
  const DeviceOptimizerKernels* kernels = g.device.is_cpu() ? nullptr : device_optimizer_kernels();
  if (norm_beside_backward_) {
    norm_beside_backward_ = false;
  } else if (kernels) {
    kernels->sum_of_squares(g_shard.ptr<float>(), n, norm_result_.ptr<double>(), nullptr);
  } else {
    const double sq = g.dtype == DType::F64
                          ? sum_of_squares<double>(std::span<const double>(g_shard.ptr<double>(), n))
                          : sum_of_squares<float>(std::span<const float>(g_shard.ptr<float>(), n));
    copy(norm_result_, contiguous_view(const_cast<double*>(&sq), DType::F64, Device::cpu(), {1}));
  }
  world.all_reduce(norm_result_.data(), 1, DType::F64, comm::ReduceOp::Sum);
  double sq_norm = 0;
  copy(contiguous_view(&sq_norm, DType::F64, Device::cpu(), {1}), norm_result_);
  AdamWStep plan = plan_adamw_step(cfg_.adamw, completed_, out.lr, sq_norm);
  // A batch whose masks leave nothing to learn from moves no weight: AdamW's decay and momentum would.
  if (out.valid_tokens == 0) plan.skipped = true, plan.step = completed_;
  out.grad_norm = plan.grad_norm;
  out.skipped = plan.skipped;
  mark(Phase::NormClip);

  // 6. AdamW on the shard, its new compute weights into the policy's buffer, then everyone's.
  if (!plan.skipped) {
    const TensorView w = flat(policy_->weights(), "weights");
    if (kernels) {
      DeviceAdamWShard s;
      s.master = shard_.master.ptr<float>();
      s.exp_avg = shard_.exp_avg.ptr<float>();
      s.exp_avg_sq = shard_.exp_avg_sq.ptr<float>();
      s.grad = g_shard.ptr<float>();
      s.compute_bf16 = reinterpret_cast<uint16_t*>(byte_at(w, shard_.begin));
      s.n = n;
      kernels->adamw_update(plan, s, nullptr);
    } else if (g.dtype == DType::F64) {
      adamw_update<double>(plan, shard_.master.ptr<double>(), shard_.exp_avg.ptr<double>(),
                           shard_.exp_avg_sq.ptr<double>(), g_shard.ptr<double>(), n,
                           {byte_at(w, shard_.begin), w.dtype});
    } else {
      adamw_update<float>(plan, shard_.master.ptr<float>(), shard_.exp_avg.ptr<float>(), shard_.exp_avg_sq.ptr<float>(),
                          g_shard.ptr<float>(), n, {byte_at(w, shard_.begin), w.dtype});
    }
    mark(Phase::AdamW);
    all_gather_weights();
    mark(Phase::AllGather);
    completed_ = plan.step;
  }

  // 7. The schedule steps once per train step.
  ++steps_;
  schedule_.step();
}

}  // namespace ringtrain::train
