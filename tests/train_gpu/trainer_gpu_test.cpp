// The train step on one GPU (bf16 GPU policy, fp32 gradients, the device AdamW and sum of squares, a one-rank NCCL
// world) against a reference built from the same GPU policy's own pieces: the whole batch scored at once, the loss
// of losses.h, its backward, and trainmath's host AdamW in fp64 on the gradients read back. Skips without a GPU.
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

#include "ringtrain/comm/rendezvous.h"
#include "train/train_test_util.h"
#ifdef RINGTRAIN_WITH_NCCL
#include "ringtrain/comm/nccl/nccl_communicator.h"
#endif

namespace ringtrain::train {
namespace {

#ifdef RINGTRAIN_WITH_NCCL
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

    comm::RankInfo single;
    single.source = "single process";
    auto world = comm::make_nccl_communicator(single, std::chrono::seconds(60));
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
