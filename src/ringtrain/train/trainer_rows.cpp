// Trainer::step(TrainRows): the train step of trainer.cpp with the batch in device memory. Per microbatch its rows
// are gathered from the caller's views into padded [batch, seq] buffers on the device (the host losses' form), and
// the loss kernels of device_loss.h give the counts, the token-local gradient inside the LM head (or DPO's gradient
// between the forward and the backward) and the loss's sums. What comes back to the host: the token-id check's
// verdict, one array of counts and mask verdicts for all microbatches, and one of the loss's sums.
#include <cstring>

#include "ringtrain/comm/agreed.h"
#include "ringtrain/core/device_ops.h"
#include "ringtrain/core/error.h"
#include "ringtrain/train/device_loss.h"
#include "ringtrain/train/trainer.h"
#include "ringtrain/train/trainer_detail.h"

namespace ringtrain::train {
namespace {

// The per-microbatch verdicts: the CountSlot counts (as doubles) and the first bad token / sample mask entry.
constexpr int kTokenMaskBad = kCountSlots, kSampleMaskBad = kCountSlots + 1, kVerdicts = kCountSlots + 2;

// The fields of TrainRows besides the ids: their shapes ([B, C] per token, [B] per sequence) and whether they are
// masks (any dtype, 0/1) or floating.
struct Field {
  const char* name;
  TensorView TrainRows::*view;
  bool per_token, per_row, mask;
};
constexpr Field kTokenMask{"token_mask", &TrainRows::token_mask, true, false, true};
constexpr Field kSampleMask{"sample_mask", &TrainRows::sample_mask, false, true, true};
constexpr Field kAdvantages{"advantages", &TrainRows::advantages, true, true, false};
constexpr Field kPrev{"prev_logprobs", &TrainRows::prev_logprobs, true, false, false};
constexpr Field kRef{"ref_logprobs", &TrainRows::ref_logprobs, true, false, false};
constexpr Field kGen{"gen_logprobs", &TrainRows::gen_logprobs, true, false, false};
constexpr const Field* kFields[] = {&kTokenMask, &kSampleMask, &kAdvantages, &kPrev, &kRef, &kGen};

// A field of the batch as a gather source, its device and shape checked.
DeviceSource source_of(const TrainRows& tb, const Field& f, Device device) {
  const TensorView& v = tb.*f.view;
  const int64_t rows = tb.ids.shape[0], cols = tb.ids.shape[1];
  RT_CHECK(v.device == device, "train rows: ", f.name, " is on ", device_name(v.device), ", the policy on ",
           device_name(device));
  if (f.per_token && v.ndim == 2 && v.shape[0] == rows && v.shape[1] == cols)
    return {v.data, v.dtype, v.stride[0], v.stride[1]};
  if (f.per_row && v.ndim == 1 && v.shape[0] == rows) return {v.data, v.dtype, v.stride[0], 0};
  throw Error(cat("train rows: ", f.name, " is ", v.shape_str(), ", expected ",
                  f.per_token ? cat("[", rows, ", ", cols, "]") : std::string(),
                  f.per_token && f.per_row ? " or " : "", f.per_row ? cat("[", rows, "]") : std::string()));
}

// One microbatch's buffers on the device.
struct RowsMicro {
  std::vector<int64_t> index, lengths;  // its sequences in the batch, and their lengths
  int64_t batch = 0, seq = 0;
  Tensor ids, token_mask, sample_mask, advantages, prev, ref, gen;
  Tensor logprobs, entropy, d_logprobs;
  Tensor rows_lengths;  // index then lengths, int64, for the gathers
  Tensor row_count, row_scale, scratch;

  DeviceMicro view() const {
    DeviceMicro m;
    m.batch = batch, m.seq = seq;
    m.token_mask = token_mask.ptr<uint8_t>();
    m.sample_mask = sample_mask.ptr<uint8_t>();
    const auto f = [](const Tensor& t) { return t.defined() ? t.ptr<float>() : nullptr; };
    m.advantages = f(advantages), m.prev = f(prev), m.ref = f(ref), m.gen = f(gen);
    return m;
  }
  TensorView padded(const Tensor& t) const {
    return contiguous_view(t.data(), t.dtype(), t.view().device, {batch, seq});
  }
  model::TokenRows token_rows(bool packed) const {
    model::TokenRows r;
    r.ids = padded(ids);
    r.lengths = lengths;
    r.packed = packed;
    for (int64_t b = 0; b < batch; ++b) r.rows.push_back(b);
    return r;
  }
};

// The token-local gradient of the configured loss on one microbatch, for the policy's LM head.
class RowsGradient final : public model::DeviceTokenGradient {
 public:
  RowsGradient(const DeviceLossKernels& k, const LossConfig& cfg, const RowsMicro& m)
      : k_(k), cfg_(cfg), m_(m.view()), row_scale_(m.row_scale.ptr<double>()) {}
  void operator()(const float* logprobs, const int32_t* seq_pos, int64_t n, float* d) const override {
    k_.token_gradient(cfg_, m_, row_scale_, logprobs, seq_pos, n, d);
  }

 private:
  const DeviceLossKernels& k_;
  const LossConfig& cfg_;
  DeviceMicro m_;
  const double* row_scale_;
};

void validate_rows(const TrainRows& tb, const LossConfig& loss, const model::Policy& policy) {
  const Device dev = policy.device();
  RT_CHECK(tb.ids.device == dev, "train rows: input_ids are on ", device_name(tb.ids.device), ", the policy on ",
           device_name(dev));
  check_row_lengths(tb.ids, tb.lengths);
  const int64_t n = tb.ids.shape[0];
  RT_CHECK(n > 0, "train rows: no sequences");
  for (int64_t i = 0; i < n; ++i)
    RT_CHECK(tb.lengths[static_cast<size_t>(i)] >= 1, "train rows: sequence ", i, " is empty");
  const bool pg = loss.kind == LossKind::ClippedPG, dpo = loss.kind == LossKind::DPO;
  RT_CHECK(!pg || tb.advantages.data, "train rows: this loss needs advantages");
  RT_CHECK(!pg || tb.prev_logprobs.data, "train rows: this loss needs prev_logprobs");
  RT_CHECK(!(dpo || (pg && loss.pg.kl_beta != 0)) || tb.ref_logprobs.data, "train rows: this loss needs ref_logprobs");
  RT_CHECK(!dpo || n % 2 == 0, "train rows: DPO needs chosen/rejected pairs, got ", n, " sequences");
  for (const Field* f : kFields) {
    const TensorView& v = tb.*f->view;
    if (!v.data) continue;
    source_of(tb, *f, dev);
    RT_CHECK(f->mask || is_float(v.dtype), "train rows: ", f->name, " is ", dtype_name(v.dtype),
             ", expected a floating dtype");
  }
  const int64_t bad = device_ops(tb.ids, "input_ids").first_outside(tb.ids, tb.lengths, policy.config().vocab);
  RT_CHECK(bad < 0, "train rows: input_ids[", bad / tb.ids.shape[1], ", ", bad % tb.ids.shape[1], "] = ",
           integer_at(tb.ids, bad), " is outside the vocabulary [0, ", policy.config().vocab, ")");
}

}  // namespace

StepResult Trainer::step(const TrainRows& batch, const PhaseHook& on_phase_end) {
  const auto mark = [&](Phase p) {
    if (on_phase_end) on_phase_end(p);
  };
  const DeviceLossKernels* kernels = device_loss_kernels();
  model::DeviceRowsTraining* rows_training = policy_->device_rows_training();
  RT_CHECK(kernels && rows_training, "trainer: a batch of device rows needs a GPU policy and a build with CUDA; the ",
           "policy is on ", device_name(policy_->device()));
  comm::all_or_none(mesh_->world(), "train step", [&] { validate_rows(batch, cfg_.loss, *policy_); });
  const Device dev = policy_->device();
  const LossConfig& loss = cfg_.loss;
  const bool dpo = loss.kind == LossKind::DPO, entropy = loss.kind == LossKind::ClippedPG;
  StepResult out;
  out.step = steps_ + 1;
  out.lr = schedule_.lr();

  // 1. This dp rank's part and its microbatches, gathered from the caller's views; masks checked, rows counted.
  const auto [first, last] = detail::dp_part(batch.ids.shape[0], loss.kind, *mesh_);
  const Tensor one = Tensor::empty({1}, DType::U8, dev);  // an absent mask: 1 everywhere (strides 0)
  fill(one, 1.0);
  const DeviceSource all_ones{one.data(), DType::U8, 0, 0};
  const std::vector<std::vector<int64_t>> plan = detail::plan_micros(cfg_, batch.lengths, first, last);
  const auto micro_count = static_cast<int64_t>(plan.size());
  Tensor verdicts = Tensor::empty({std::max<int64_t>(micro_count, 1), kVerdicts}, DType::I64, dev);
  fill(verdicts, -1.0);
  std::vector<RowsMicro> micros(plan.size());
  for (size_t k = 0; k < plan.size(); ++k) {
    RowsMicro& m = micros[k];
    m.index = plan[k];
    m.batch = static_cast<int64_t>(m.index.size());
    for (int64_t i : m.index) {
      m.lengths.push_back(batch.lengths[static_cast<size_t>(i)]);
      m.seq = std::max(m.seq, m.lengths.back());
    }
    std::vector<int64_t> rows_lengths = m.index;
    rows_lengths.insert(rows_lengths.end(), m.lengths.begin(), m.lengths.end());
    m.rows_lengths = Tensor::empty({2 * m.batch}, DType::I64, dev);
    copy(m.rows_lengths, contiguous_view(rows_lengths.data(), DType::I64, Device::cpu(), {2 * m.batch}));
    const int64_t* rows = m.rows_lengths.ptr<int64_t>();
    const int64_t* lengths = rows + m.batch;
    int64_t* verdict = verdicts.ptr<int64_t>() + static_cast<int64_t>(k) * kVerdicts;
    // Into a new [batch, seq] buffer: the ids (no field), or a field (an absent mask is all ones).
    const auto gather = [&](const Field* f, DType out_dtype, int64_t seq, int64_t* bad) {
      Tensor t = Tensor::empty({m.batch * seq}, out_dtype, dev);
      const TensorView& v = f ? batch.*f->view : batch.ids;
      const DeviceSource src = !f        ? DeviceSource{v.data, v.dtype, v.stride[0], v.stride[1]}
                               : v.data ? source_of(batch, *f, dev)
                                        : all_ones;
      kernels->gather_padded(src, rows, lengths, m.batch, seq, out_dtype, t.data(), bad);
      return t;
    };
    m.ids = gather(nullptr, DType::I32, m.seq, nullptr);
    m.token_mask = gather(&kTokenMask, DType::U8, m.seq, verdict + kTokenMaskBad);
    m.sample_mask = gather(&kSampleMask, DType::U8, 1, verdict + kSampleMaskBad);
    if (batch.advantages.data) m.advantages = gather(&kAdvantages, DType::F32, m.seq, nullptr);
    if (batch.prev_logprobs.data) m.prev = gather(&kPrev, DType::F32, m.seq, nullptr);
    if (batch.ref_logprobs.data) m.ref = gather(&kRef, DType::F32, m.seq, nullptr);
    if (batch.gen_logprobs.data) m.gen = gather(&kGen, DType::F32, m.seq, nullptr);
    m.row_count = Tensor::empty({m.batch}, DType::F64, dev);
    kernels->count(m.view(), dpo, m.row_count.ptr<double>(), reinterpret_cast<double*>(verdict));
  }
  std::vector<int64_t> host_verdicts(static_cast<size_t>(verdicts.numel()));
  copy(contiguous_view(host_verdicts.data(), DType::I64, Device::cpu(), {verdicts.numel()}),
       contiguous_view(verdicts.data(), DType::I64, dev, {verdicts.numel()}));

  // 2. Global counts over dp, after the checks. A part's masks fail on its ranks only, so every rank raises that
  // error together.
  std::vector<double> counts(4, 0.0);  // tokens, sequences, DPO pairs, DPO chosen tokens
  comm::all_or_none(mesh_->world(), "train step", [&] {
    for (size_t k = 0; k < micros.size(); ++k) {
      const RowsMicro& m = micros[k];
      const int64_t* v = host_verdicts.data() + k * kVerdicts;
      if (v[kTokenMaskBad] >= 0) {
        const int64_t b = v[kTokenMaskBad] / m.seq, p = v[kTokenMaskBad] % m.seq;
        throw Error(cat("train rows: token_mask[", m.index[b], ", ", p, "] is neither 0 nor 1"));
      }
      RT_CHECK(v[kSampleMaskBad] < 0, "train rows: sample_mask[", m.index[v[kSampleMaskBad]], "] is neither 0 nor 1");
      double c[kCountSlots];
      std::memcpy(c, v, sizeof(c));
      RT_CHECK(!dpo || c[kBadPair] < 0, "DPO: the pair of sequences ", m.index[2 * static_cast<int64_t>(c[kBadPair])],
               " and ", m.index[2 * static_cast<int64_t>(c[kBadPair]) + 1], " has sample masks that differ");
      counts[0] += c[kTokens], counts[1] += c[kSequences], counts[2] += c[kPairs], counts[3] += c[kChosenTokens];
    }
  });
  detail::all_reduce_sum(mesh_->dp_group(), counts);
  const ValidCounts global{counts[0], counts[1]};
  const DPOCounts global_pairs{counts[2], counts[3]};
  out.valid_tokens = global.tokens, out.valid_sequences = global.sequences;

  // 3. Microbatches: score and backward, the loss's sums per microbatch on the device.
  const std::vector<std::string> names =
      loss_metric_names(loss, batch.ref_logprobs.data != nullptr, batch.gen_logprobs.data != nullptr, entropy);
  const auto width = static_cast<int64_t>(1 + names.size());
  const Tensor sums = Tensor::zeros({std::max<int64_t>(micro_count, 1), width}, DType::F64, dev);
  policy_->zero_grads();
  norm_beside_backward_ = false;
  bool stopped = false;
  for (size_t k = 0; k < micros.size(); ++k) {
    if ((stopped = comm::any_stop_requested(mesh_->cp_group(), stop_))) break;
    RowsMicro& m = micros[k];
    if (k + 1 == micros.size()) ask_norm_beside_last_backward();
    double* micro_sums = sums.ptr<double>() + static_cast<int64_t>(k) * width;
    m.logprobs = Tensor::empty({m.batch * m.seq}, DType::F32, dev);
    if (entropy) m.entropy = Tensor::empty({m.batch * m.seq}, DType::F32, dev);
    const TensorView entropy_view = entropy ? m.padded(m.entropy) : TensorView{};
    if (!dpo) {
      m.row_scale = Tensor::empty({m.batch}, DType::F64, dev);
      kernels->row_scales(loss, m.view(), global, m.row_count.ptr<double>(), m.row_scale.ptr<double>());
      rows_training->score_and_backward_rows(m.token_rows(cfg_.packed), RowsGradient(*kernels, loss, m),
                                             m.padded(m.logprobs), entropy_view);
      mark(Phase::ForwardBackward);
      kernels->token_loss(loss, m.view(), m.row_scale.ptr<double>(), m.logprobs.ptr<float>(),
                          entropy ? m.entropy.ptr<float>() : nullptr, micro_sums);
      mark(Phase::Loss);
    } else {
      rows_training->score_rows_for_backward(m.token_rows(cfg_.packed), m.padded(m.logprobs), {});
      mark(Phase::Forward);
      m.d_logprobs = Tensor::empty({m.batch * m.seq}, DType::F32, dev);
      m.scratch = Tensor::empty({3 * m.batch}, DType::F64, dev);
      kernels->dpo(loss.dpo, m.view(), global_pairs, m.logprobs.ptr<float>(), m.d_logprobs.ptr<float>(), micro_sums,
                   m.scratch.ptr<double>());
      mark(Phase::Loss);
      rows_training->backward_rows(m.padded(m.d_logprobs));
      mark(Phase::Backward);
    }
    m.logprobs = m.entropy = m.d_logprobs = Tensor();  // the next microbatch's forward may reuse the memory
  }

  comm::agree_to_stop(mesh_->world(), stop_, stopped, cat("train step ", out.step));

  // The loss and the metrics over dp: per microbatch in order, as step(TrainBatch) adds them.
  std::vector<double> host_sums(static_cast<size_t>(sums.numel()));
  copy(contiguous_view(host_sums.data(), DType::F64, Device::cpu(), {sums.numel()}),
       contiguous_view(sums.data(), DType::F64, dev, {sums.numel()}));
  std::vector<double> totals(static_cast<size_t>(width), 0.0);
  for (int64_t k = 0; k < micro_count; ++k) {
    out.microbatch_losses.push_back(host_sums[static_cast<size_t>(k * width)]);
    for (int64_t j = 0; j < width; ++j) totals[static_cast<size_t>(j)] += host_sums[static_cast<size_t>(k * width + j)];
  }
  detail::all_reduce_sum(mesh_->dp_group(), totals);
  out.loss = out.valid_tokens > 0 ? totals[0] : kNoValue;  // a loss over nothing is not 0
  for (size_t j = 0; j < names.size(); ++j) {
    const double count = dpo ? (names[j] == "chosen_nll" ? global_pairs.chosen_tokens : global_pairs.pairs)
                             : global.tokens;
    out.metrics.push_back({names[j], count > 0 ? totals[1 + j] / count : kNoValue, count});
  }

  apply_gradients(out, on_phase_end);
  return out;
}

}  // namespace ringtrain::train
