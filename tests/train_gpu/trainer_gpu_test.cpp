// The train step on one GPU (bf16 GPU policy, fp32 gradients, the device AdamW and sum of squares, a one-rank NCCL
// world) against a reference built from the same GPU policy's own pieces: the whole batch scored at once, the loss
// of losses.h, its backward, and trainmath's host AdamW in fp64 on the gradients read back. Skips without a GPU.
//
// Tolerances: with RINGTRAIN_GEMM_AUTOTUNE=0 both runs take the same GEMM algorithms, so their forwards are the same
// and their gradients differ only by the order of the backward's fp32 atomic sums (norm weights, embedding), ~1e-6;
// the update (new − start master weights) is smooth in the gradient (AdamW's eps of the gradients' order) and the
// reference's AdamW runs in fp64 against the trainer's fp32: 2e-3 on the update and 1e-2 on the norm leave room for
// bf16 roundings that flip, 1e-4 on the loss. A wrong shard, dtype or missing clip moves them by O(1).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "train/train_test_util.h"
#ifdef RINGTRAIN_WITH_NCCL
#include "ringtrain/comm/nccl/nccl_communicator.h"
#endif

namespace ringtrain::train {
namespace {

TEST(TrainerGpu, OneGpuStepMatchesTheHostReference) {
  RT_REQUIRE_GPU();
#ifndef RINGTRAIN_WITH_NCCL
  GTEST_SKIP() << "this build has no NCCL communicator";
#else
  ::setenv("RINGTRAIN_GEMM_AUTOTUNE", "0", 1);
  model::ModelConfig c = testing::train_config();
  c.hidden = 128, c.heads = 4, c.kv_heads = 2, c.head_dim = 32, c.ffn = 256, c.vocab = 300;
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

    // The fp32 master shard (here: all of it) in layout order, against the reference's fp64 update.
    const ShardState& sh = trainer.shard();
    std::vector<float> master(static_cast<size_t>(sh.master.numel()));
    copy(contiguous_view(master.data(), DType::F32, Device::cpu(), {sh.master.numel()}), sh.master);
    double num = 0, den = 0;
    for (size_t i = 0; i < policy->layout().specs().size(); ++i) {
      const model::ParamSpec& spec = policy->layout().specs()[i];
      for (int64_t e = 0; e < spec.numel; ++e) {
        const double got_update = master[policy->flat_offsets()[i] + e] - double(start[spec.offset + e]);
        const double want_update = want[spec.offset + e] - double(start[spec.offset + e]);
        num += (got_update - want_update) * (got_update - want_update);
        den += want_update * want_update;
      }
    }
    EXPECT_LE(std::sqrt(num / den), 2e-3) << (kind == LossKind::NLL ? "nll" : "pg");
    EXPECT_GT(den, 0);
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

}  // namespace
}  // namespace ringtrain::train
