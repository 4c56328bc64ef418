// The train step on one GPU (bf16 GPU policy, fp32 gradients, the device AdamW and sum of squares, a one-rank NCCL
// world) against a reference built from the same GPU policy's own pieces: the whole batch scored at once, the loss
// of losses.h, its backward, and host_adamw.h's AdamW in fp64 on the gradients read back. Skips without a GPU.
//
// Tolerances: the reference scores the 6 sequences as one batch padded to the longest, the trainer in microbatches
// of 2 padded to their own longest, so GEMM and attention shapes differ and so can bf16 roundings of activations
// (RINGTRAIN_GEMM_AUTOTUNE=0 keeps each shape's algorithm fixed, not the same across shapes); gradients also differ
// by the order of fp32 atomic sums. The update (new − start master weights) is smooth in the gradient (AdamW's eps
// of the gradients' order) and the reference's AdamW runs in fp64 against the trainer's fp32: measured relative
// update errors 0.3e-3 to 5.5e-3 over 6 runs on an H200, so 1e-2 on the update; 1e-2 on the norm, 1e-4 on the loss.
// A wrong shard, dtype, missed microbatch or missing clip moves them by O(1).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <cstdlib>
#include <functional>

#include "ringtrain/comm/rendezvous.h"
#include "train/train_test_util.h"
#ifdef RINGTRAIN_WITH_NCCL
#include "ringtrain/comm/nccl/nccl_communicator.h"
#endif

namespace ringtrain::train {
namespace {

#ifdef RINGTRAIN_WITH_NCCL
// A one-rank NCCL world on GPU 0.
auto one_gpu_world() {
  comm::RankInfo single;
  single.source = "single process";
  return comm::make_nccl_communicator(single, std::chrono::seconds(60));
}

model::ModelConfig gpu_train_config() {
  model::ModelConfig c = testing::train_config();
  c.hidden = 128, c.heads = 4, c.kv_heads = 2, c.head_dim = 64, c.ffn = 256, c.vocab = 300;
  return c;
}

// Σ (got − want)² / Σ want² of the master update over the elements of this rank's shard (flat order → layout).
double shard_update_error(model::Policy& policy, const ShardState& sh, const std::vector<float>& start,
                          const std::vector<double>& want) {
  std::vector<float> master(static_cast<size_t>(sh.master.numel()));
  copy(contiguous_view(master.data(), DType::F32, Device::cpu(), {sh.master.numel()}), sh.master);
  double num = 0, den = 0;
  for (size_t i = 0; i < policy.layout().specs().size(); ++i) {
    const model::ParamSpec& spec = policy.layout().specs()[i];
    const int64_t off = policy.flat_offsets()[i];
    for (int64_t e = std::max<int64_t>(0, sh.begin - off); e < spec.numel && off + e < sh.end; ++e) {
      const double got_update = master[off + e - sh.begin] - double(start[spec.offset + e]);
      const double want_update = want[spec.offset + e] - double(start[spec.offset + e]);
      num += (got_update - want_update) * (got_update - want_update);
      den += want_update * want_update;
    }
  }
  return den > 0 ? std::sqrt(num / den) : std::numeric_limits<double>::infinity();
}
#endif

TEST(TrainerGpu, OneGpuStepMatchesTheHostReference) {
  RT_REQUIRE_GPU();
#ifndef RINGTRAIN_WITH_NCCL
  GTEST_SKIP() << "this build has no NCCL communicator";
#else
  ::setenv("RINGTRAIN_GEMM_AUTOTUNE", "0", 1);
  const model::ModelConfig c = gpu_train_config();
  for (LossKind kind : {LossKind::NLL, LossKind::ClippedPG}) {
    std::mt19937_64 rng(testing::fresh_seed());
    const testing::TrainSetup s = testing::make_train_setup(kind, rng, 6, c);
    model::PolicyOptions o;
    o.device = Device::cuda(0);
    o.dtype = DType::BF16;
    double want_loss = 0, want_norm = 0;
    const std::vector<double> want = testing::reference_step(s, o, &want_loss, &want_norm);

    const auto world = one_gpu_world();
    const Mesh mesh(*world, {1, 1});
    o.cp_group = &mesh.cp_group();
    const auto policy = model::make_policy(s.config, s.params, o);
    const std::vector<float> start = policy->params();
    Trainer trainer(s.cfg, *policy, mesh);
    const StepResult got = trainer.step(s.batch);
    EXPECT_FALSE(got.skipped);
    EXPECT_NEAR(got.loss, want_loss, 1e-4 * std::abs(want_loss));
    EXPECT_NEAR(got.grad_norm, want_norm, 1e-2 * want_norm);

    EXPECT_LE(shard_update_error(*policy, trainer.shard(), start, want), 1e-2)
        << (kind == LossKind::NLL ? "nll" : "pg");
    std::vector<float> master(static_cast<size_t>(trainer.shard().master.numel()));
    copy(contiguous_view(master.data(), DType::F32, Device::cpu(), {trainer.shard().master.numel()}),
         trainer.shard().master);
    // The compute weights are the master's bf16 rounding.
    const std::vector<float> weights = policy->params();
    for (size_t i = 0; i < policy->layout().specs().size(); ++i) {
      const model::ParamSpec& spec = policy->layout().specs()[i];
      for (int64_t e = 0; e < spec.numel; e += 7) {
        const float m = master[policy->flat_offsets()[i] + e];
        ASSERT_EQ(weights[spec.offset + e], bf16_to_float(float_to_bf16(m))) << spec.name << " element " << e;
      }
    }
  }
#endif
}

#ifdef RINGTRAIN_WITH_NCCL
// A host batch as the caller's device tensors: ids int64 [B, C] with ids outside the vocabulary past each length, a
// float32 token_mask, an int32 sample_mask, per-sequence advantages [B], logprobs with NaN past each length (none of
// which the step may read).
struct DeviceBatch {
  Tensor ids, token_mask, sample_mask, advantages, prev, ref, gen;
  TrainRows rows;
};

DeviceBatch upload_rows(const TrainBatch& b, int64_t vocab, Device dev) {
  const auto B = static_cast<int64_t>(b.sequences.size());
  int64_t C = 0;
  for (const auto& s : b.sequences) C = std::max<int64_t>(C, static_cast<int64_t>(s.size()) + 3);
  // [rows, cols], or [rows] with cols 0
  const auto up = [&](const std::vector<double>& host, DType dtype, int64_t rows, int64_t cols) {
    Tensor t = cols ? Tensor::empty({rows, cols}, dtype, dev) : Tensor::empty({rows}, dtype, dev);
    auto* data = const_cast<double*>(host.data());
    const TensorView h = cols ? contiguous_view(data, DType::F64, Device::cpu(), {rows, cols})
                              : contiguous_view(data, DType::F64, Device::cpu(), {rows});
    copy(t, h);
    return t;
  };
  const auto per_token = [&](const std::vector<std::vector<float>>& f, double past) {
    std::vector<double> v(static_cast<size_t>(B * C), past);
    for (int64_t i = 0; i < B; ++i)
      for (size_t p = 0; p < f[i].size(); ++p) v[i * C + p] = f[i][p];
    return v;
  };
  DeviceBatch d;
  std::vector<double> ids(static_cast<size_t>(B * C), double(vocab + 5)), mask(ids.size(), 7.0), sample(B);
  for (int64_t i = 0; i < B; ++i) {
    for (size_t p = 0; p < b.sequences[i].size(); ++p)
      ids[i * C + p] = b.sequences[i][p], mask[i * C + p] = b.token_mask[i][p];
    sample[i] = b.sample_mask[i];
    d.rows.lengths.push_back(static_cast<int64_t>(b.sequences[i].size()));
  }
  const double nan = std::numeric_limits<double>::quiet_NaN();
  d.ids = up(ids, DType::I64, B, C);
  d.token_mask = up(mask, DType::F32, B, C);
  d.sample_mask = up(sample, DType::I32, B, 0);
  d.rows.ids = d.ids.view(), d.rows.token_mask = d.token_mask.view(), d.rows.sample_mask = d.sample_mask.view();
  if (!b.advantages.empty()) {
    std::vector<double> adv(B);
    for (int64_t i = 0; i < B; ++i) adv[i] = b.advantages[i][0];  // one per sequence in the setup
    d.advantages = up(adv, DType::F32, B, 0);
    d.rows.advantages = d.advantages.view();
  }
  const auto field = [&](const std::vector<std::vector<float>>& f, Tensor& t, TensorView& v) {
    if (f.empty()) return;
    t = up(per_token(f, nan), DType::F32, B, C);
    v = t.view();
  };
  field(b.prev_logprobs, d.prev, d.rows.prev_logprobs);
  field(b.ref_logprobs, d.ref, d.rows.ref_logprobs);
  field(b.gen_logprobs, d.gen, d.rows.gen_logprobs);
  return d;
}

std::vector<float> master_of(const Trainer& t) {
  const Tensor& m = const_cast<Trainer&>(t).shard().master;
  std::vector<float> out(static_cast<size_t>(m.numel()));
  copy(contiguous_view(out.data(), DType::F32, Device::cpu(), {m.numel()}), m);
  return out;
}
#endif

// The step from device rows (the device loss kernels, the policy's rows training) against the step from the same
// batch in host memory, on twin policies: the same microbatches score the same logprobs, so the loss and the metrics
// differ only by the order of fp64 sums (1e-9 relative); the gradients only by the order of the backward's fp32
// atomic sums (a few fp32 ulps), so 1e-5 on the norm and 1e-4 on the master's update. A lost microbatch, a wrong
// normaliser or a gradient applied twice moves them by O(1).
TEST(TrainerGpu, DeviceRowsStepEqualsTheHostStep) {
  RT_REQUIRE_GPU();
#ifndef RINGTRAIN_WITH_NCCL
  GTEST_SKIP() << "this build has no NCCL communicator";
#else
  ::setenv("RINGTRAIN_GEMM_AUTOTUNE", "0", 1);
  const model::ModelConfig c = gpu_train_config();
  const auto world = one_gpu_world();
  const Mesh mesh(*world, {1, 1});
  struct Case {
    LossKind kind;
    bool packed, sequence_mean, importance;
  };
  for (const Case& k : {Case{LossKind::NLL, false, false, false}, Case{LossKind::NLL, true, false, false},
                        Case{LossKind::ClippedPG, false, false, true}, Case{LossKind::ClippedPG, true, true, false},
                        Case{LossKind::DPO, false, false, false}, Case{LossKind::DPO, true, false, false}}) {
    std::mt19937_64 rng(testing::fresh_seed());
    testing::TrainSetup s = testing::make_train_setup(k.kind, rng, 6, c);
    s.cfg.packed = k.packed;
    if (k.sequence_mean) {
      s.cfg.loss.pg.aggregation = Aggregation::SequenceMean;
      // A sampled sequence without a counted token still counts in the sequence mean's denominator.
      const size_t last = s.batch.sequences.size() - 1;  // sampled: make_train_setup unsamples one of the first half
      std::fill(s.batch.token_mask[last].begin(), s.batch.token_mask[last].end(), 0);
    }
    if (k.kind == LossKind::ClippedPG && !k.importance) s.batch.gen_logprobs.clear();
    const std::string what = cat(k.kind == LossKind::NLL ? "nll" : k.kind == LossKind::DPO ? "dpo" : "pg",
                                 k.packed ? " packed" : " padded", k.sequence_mean ? " sequence-mean" : "",
                                 k.importance ? " importance" : "");
    model::PolicyOptions o;
    o.device = Device::cuda(0);
    o.dtype = DType::BF16;
    o.logprob_chunk = 7;  // several LM-head chunks per microbatch
    o.cp_group = &mesh.cp_group();
    const auto host_policy = model::make_policy(s.config, s.params, o);
    const auto rows_policy = model::make_policy(s.config, s.params, o);
    Trainer host(s.cfg, *host_policy, mesh), rows(s.cfg, *rows_policy, mesh);
    const DeviceBatch d = upload_rows(s.batch, c.vocab, o.device);
    const StepResult want = host.step(s.batch);
    const StepResult got = rows.step(d.rows);

    EXPECT_TRUE(std::isfinite(got.loss)) << what;
    EXPECT_NEAR(got.loss, want.loss, 1e-9 * std::max(1.0, std::abs(want.loss))) << what;
    EXPECT_EQ(got.valid_tokens, want.valid_tokens) << what;
    EXPECT_EQ(got.valid_sequences, want.valid_sequences) << what;
    if (k.sequence_mean)
      EXPECT_EQ(want.valid_sequences, std::count(s.batch.sample_mask.begin(), s.batch.sample_mask.end(), 1)) << what;
    ASSERT_EQ(got.microbatch_losses.size(), want.microbatch_losses.size()) << what;
    for (size_t i = 0; i < want.microbatch_losses.size(); ++i)
      EXPECT_NEAR(got.microbatch_losses[i], want.microbatch_losses[i], 1e-9 * std::max(1.0, std::abs(want.loss)))
          << what << " microbatch " << i;
    ASSERT_EQ(got.metrics.size(), want.metrics.size()) << what;
    for (size_t i = 0; i < want.metrics.size(); ++i) {
      EXPECT_EQ(got.metrics[i].name, want.metrics[i].name) << what;
      EXPECT_EQ(got.metrics[i].count, want.metrics[i].count) << what << " " << want.metrics[i].name;
      EXPECT_NEAR(got.metrics[i].value, want.metrics[i].value, 1e-9 * std::max(1.0, std::abs(want.metrics[i].value)))
          << what << " " << want.metrics[i].name;
    }
    EXPECT_GT(want.grad_norm, 0) << what;
    EXPECT_NEAR(got.grad_norm, want.grad_norm, 1e-5 * want.grad_norm) << what;
    const std::vector<float> start = s.params, a = master_of(host), b = master_of(rows);
    double num = 0, den = 0;
    for (size_t i = 0; i < host_policy->layout().specs().size(); ++i) {
      const model::ParamSpec& spec = host_policy->layout().specs()[i];
      const int64_t off = host_policy->flat_offsets()[i];
      for (int64_t e = 0; e < spec.numel; ++e) {
        const double wu = a[off + e] - double(start[spec.offset + e]), gu = b[off + e] - double(start[spec.offset + e]);
        num += (gu - wu) * (gu - wu), den += wu * wu;
      }
    }
    EXPECT_GT(den, 0) << what;
    EXPECT_LE(std::sqrt(num / den), 1e-4) << what;
  }

  // A batch with no counted token: both paths skip the step and report no loss (NaN, null in metrics.jsonl).
  std::mt19937_64 rng(testing::fresh_seed());
  testing::TrainSetup s = testing::make_train_setup(LossKind::NLL, rng, 6, c);
  std::fill(s.batch.sample_mask.begin(), s.batch.sample_mask.end(), 0);
  model::PolicyOptions o;
  o.device = Device::cuda(0);
  o.dtype = DType::BF16;
  o.cp_group = &mesh.cp_group();
  const auto host_policy = model::make_policy(s.config, s.params, o), rows_policy = model::make_policy(s.config, s.params, o);
  Trainer host(s.cfg, *host_policy, mesh), rows(s.cfg, *rows_policy, mesh);
  const DeviceBatch d = upload_rows(s.batch, c.vocab, o.device);
  const StepResult want = host.step(s.batch), got = rows.step(d.rows);
  EXPECT_TRUE(want.skipped && got.skipped);
  EXPECT_TRUE(std::isnan(want.loss) && std::isnan(got.loss)) << want.loss << " " << got.loss;
#endif
}

// What the rows step refuses, before any forward, with the field and the place named.
TEST(TrainerGpu, DeviceRowsRefuseBadValues) {
  RT_REQUIRE_GPU();
#ifndef RINGTRAIN_WITH_NCCL
  GTEST_SKIP() << "this build has no NCCL communicator";
#else
  const model::ModelConfig c = gpu_train_config();
  const auto world = one_gpu_world();
  const Mesh mesh(*world, {1, 1});
  std::mt19937_64 rng(testing::fresh_seed());
  testing::TrainSetup s = testing::make_train_setup(LossKind::ClippedPG, rng, 6, c);
  model::PolicyOptions o;
  o.device = Device::cuda(0);
  o.dtype = DType::BF16;
  o.cp_group = &mesh.cp_group();
  const auto policy = model::make_policy(s.config, s.params, o);
  Trainer trainer(s.cfg, *policy, mesh);
  const auto expect_error = [&](const TrainBatch& b, const std::function<void(DeviceBatch&)>& spoil,
                                const std::string& needle) {
    DeviceBatch d = upload_rows(b, c.vocab, o.device);
    spoil(d);
    try {
      trainer.step(d.rows);
      ADD_FAILURE() << "no error; expected one naming " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  // Element `at` (row-major) of a device tensor set to v.
  const auto set = [](const Tensor& t, int64_t at, double v) {
    const TensorView flat = contiguous_view(t.data(), t.dtype(), t.view().device, {t.numel()});
    copy(flat.slice(0, at, 1), contiguous_view(&v, DType::F64, Device::cpu(), {1}));
  };
  expect_error(s.batch, [&](DeviceBatch& d) { set(d.token_mask, 2 * d.ids.view().shape[1] + 1, 0.5); },
               "token_mask[2, 1] is neither 0 nor 1");
  expect_error(s.batch, [&](DeviceBatch& d) { set(d.sample_mask, 3, 2.0); }, "sample_mask[3] is neither 0 nor 1");
  expect_error(s.batch, [&](DeviceBatch& d) { set(d.ids, 1 * d.ids.view().shape[1] + 2, double(c.vocab)); },
               cat("input_ids[1, 2] = ", c.vocab, " is outside the vocabulary"));
  expect_error(s.batch, [&](DeviceBatch& d) { d.rows.prev_logprobs = {}; }, "needs prev_logprobs");
  expect_error(s.batch, [&](DeviceBatch& d) { d.rows.lengths[0] = d.ids.view().shape[1] + 1; }, "length");
  expect_error(
      s.batch, [&](DeviceBatch& d) { d.rows.advantages = d.token_mask.view().slice(1, 0, 2); }, "advantages is");
  // Nothing was applied by the refused steps.
  EXPECT_EQ(trainer.steps_taken(), 0);
#endif
}

// Two GPUs: dp = 2 and cp = 2 meshes against each rank's own one-GPU reference, for NLL and the clipped PG.
TEST(TrainerGpu, TwoGpusMatchOne) {
  if (testing::inside_rank()) GTEST_SKIP() << "parent test";
  RT_REQUIRE_GPU();
#ifndef RINGTRAIN_WITH_NCCL
  GTEST_SKIP() << "this build has no NCCL communicator";
#endif
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs 2 GPUs, found " << cuda_device_count();
  EXPECT_EQ(testing::run_ranks_of_this_program("TrainerGpuRank.*", 2), 0);
}

#ifdef RINGTRAIN_WITH_NCCL
// Tolerances: dp = 2 scores other microbatches (the same per-sequence arithmetic but for GEMM shapes), as the
// one-GPU test. cp = 2 runs the ring attention in bf16 and the zigzag shards' GEMMs: logprobs move by up to ~1e-2
// (the GPU policy's own CP tolerance is 2e-2), so 1e-2 on the loss (per unit of magnitude), 5e-2 on the norm and the
// update. The compute weights, gathered from both ranks' shards, are within one bf16 step of the reference's master.
TEST(TrainerGpuRank, Dp2AndCp2MatchOneGpu) {
  if (!testing::inside_rank()) GTEST_SKIP() << "runs inside a rank started by the parent test";
  ::setenv("RINGTRAIN_GEMM_AUTOTUNE", "0", 1);
  auto world = comm::make_nccl_communicator(comm::rank_info_from_environment(), std::chrono::seconds(120));
  int64_t seed = static_cast<int64_t>(testing::fresh_seed() >> 1);  // rank 0's, for both
  Tensor seed_dev = Tensor::empty({1}, DType::I64, world->device());
  copy(seed_dev, contiguous_view(&seed, DType::I64, Device::cpu(), {1}));
  world->broadcast(seed_dev.data(), 1, DType::I64, 0);
  copy(contiguous_view(&seed, DType::I64, Device::cpu(), {1}), seed_dev);
  for (LossKind kind : {LossKind::NLL, LossKind::ClippedPG}) {
    std::mt19937_64 rng(static_cast<uint64_t>(seed) + static_cast<uint64_t>(kind));
    const testing::TrainSetup s = testing::make_train_setup(kind, rng, 6, gpu_train_config());
    model::PolicyOptions o;
    o.device = world->device();
    o.dtype = DType::BF16;
    double want_loss = 0, want_norm = 0;
    const std::vector<double> want = testing::reference_step(s, o, &want_loss, &want_norm);
    for (MeshShape shape : {MeshShape{2, 1}, MeshShape{1, 2}}) {
      const bool cp = shape.cp > 1;
      const std::string what = cat(kind == LossKind::NLL ? "nll " : "pg ", shape.dp, "x", shape.cp);
      const Mesh mesh(*world, shape);
      o.cp_group = &mesh.cp_group();
      const auto policy = model::make_policy(s.config, s.params, o);
      const std::vector<float> start = policy->params();
      Trainer trainer(s.cfg, *policy, mesh);
      const StepResult got = trainer.step(s.batch);
      EXPECT_FALSE(got.skipped) << what;
      EXPECT_NEAR(got.loss, want_loss, (cp ? 1e-2 : 1e-4) * std::max(1.0, std::abs(want_loss))) << what;
      EXPECT_NEAR(got.grad_norm, want_norm, (cp ? 5e-2 : 1e-2) * want_norm) << what;
      EXPECT_LE(shard_update_error(*policy, trainer.shard(), start, want), cp ? 5e-2 : 2e-3) << what;
      const std::vector<float> weights = policy->params();
      for (size_t i = 0; i < weights.size(); ++i) {
        const float ref = bf16_to_float(float_to_bf16(static_cast<float>(want[i])));
        ASSERT_LE(std::abs(weights[i] - ref), std::abs(ref) * 0x1p-7f + 1e-30f) << what << " element " << i;
      }
    }
  }
}
#endif

}  // namespace
}  // namespace ringtrain::train
