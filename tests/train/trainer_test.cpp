// The train step (train/trainer.h) on CPU in-process ranks:
// - 1 × 1 against an independent reference: the whole batch scored at once by a fresh policy, the loss of
//   losses.h, its backward, and the unsharded host AdamW of host_adamw.h;
// - dp × cp ∈ {1×2, 2×1, 2×2, 1×4} against 1 × 1 on the same global batch (loss, gradient norm, metrics,
//   updated weights), for NLL, the clipped PG with KL and importance weights, and DPO, in fp64 and fp32;
// - a NaN injected into one rank's gradient skips the step on every rank, leaving weights, master weights and
//   moments bitwise unchanged; so does a batch with no valid token;
// - a bad DPO pair raises the same AgreedError on every rank, which then trains on;
// - with one rank the gradient norm's sum of squares is taken from a policy that computes it beside the step's last
//   backward, and with more ranks never asked for.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ringtrain/attention/cpu/cpu_backends.h"
#include "ringtrain/comm/agreed.h"
#include "ringtrain/comm/in_process.h"
#include "train_test_util.h"

namespace ringtrain::train {
namespace {

using testing::TrainSetup;

// Relative L2 distance, NaN-poisoned.
double rel_l2(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    if (!std::isfinite(a[i])) return std::numeric_limits<double>::infinity();
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

std::vector<double> difference(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

class TrainerLosses : public ::testing::TestWithParam<LossKind> {
 protected:
  void SetUp() override { attention::cpu::set_math_fp64(true); }
  void TearDown() override { attention::cpu::set_math_fp64(false); }
};

// 1 × 1 against the independent reference (fp64 policy). The trainer runs microbatches of 2 and the reference one
// batch of 8: the same sums in another order, so agreement to ~1e-13 relative; 1e-10 leaves room.
TEST_P(TrainerLosses, OneRankMatchesTheUnshardedReference) {
  std::mt19937_64 rng(testing::fresh_seed());
  const TrainSetup s = testing::make_train_setup(GetParam(), rng);
  double want_loss = 0, want_norm = 0;
  const std::vector<double> want = testing::reference_step(s, testing::train_policy_options(DType::F64, nullptr), &want_loss, &want_norm);
  const testing::MeshRun got = testing::run_on_mesh(s, DType::F64, {1, 1}, 1);
  ASSERT_EQ(got.results[0].size(), 1u);
  const StepResult& r = got.results[0][0];
  EXPECT_FALSE(r.skipped);
  EXPECT_NEAR(r.loss, want_loss, 1e-10 * std::abs(want_loss)) << r.loss << " vs " << want_loss;
  EXPECT_NEAR(r.grad_norm, want_norm, 1e-10 * want_norm);
  EXPECT_GT(want_norm, 0);
  const std::vector<double> start(s.params.begin(), s.params.end());
  EXPECT_LE(rel_l2(difference(got.weights[0], start), difference(want, start)), 1e-10);
}

struct MeshCase {
  int dp, cp;
  DType dtype;
};
void PrintTo(const MeshCase& k, std::ostream* os) { *os << k.dp << "x" << k.cp << " " << dtype_name(k.dtype); }

class TrainerMesh : public ::testing::TestWithParam<std::tuple<LossKind, MeshCase>> {
 protected:
  void SetUp() override { attention::cpu::set_math_fp64(true); }
  void TearDown() override { attention::cpu::set_math_fp64(false); }
};

// Tolerances. fp64 without CP: the same sums over other microbatch / rank groupings, ~1e-14 relative; 1e-10 as
// asked. With CP, or in fp32, the scores differ in their last fp32 bits: the ring merge goes through the attention
// layer's fp32 LSE (2e-6 relative on gradients in tests/model/policy_test.cpp), and TokenScores are fp32 (2^-24
// relative per logprob of ~4.6, so a DPO reward summing ~10 of them moves by ~1e-6; observed up to 1.3e-6 on rewards
// and 1.7e-6 relative on a PG loss): 1e-5 relative on the loss, norm and weight update, 1e-5 absolute (per unit of
// magnitude) on the metrics. A wrong shard, count or normaliser moves them by O(1).
// The weight update is compared (new - start), with AdamW's eps of the gradients' order so that the update is
// smooth in the gradient (no sign flips of gradients that are zero up to rounding).
TEST_P(TrainerMesh, EqualsOneRank) {
  const auto [kind, k] = GetParam();
  std::mt19937_64 rng(testing::fresh_seed());
  const TrainSetup s = testing::make_train_setup(kind, rng);
  const testing::MeshRun one = testing::run_on_mesh(s, k.dtype, {1, 1}, 1);
  const testing::MeshRun many = testing::run_on_mesh(s, k.dtype, {k.dp, k.cp}, 1);
  const bool f64 = k.dtype == DType::F64;
  const double tol = f64 && k.cp == 1 ? 1e-10 : 1e-5;
  const StepResult& want = one.results[0][0];
  const std::vector<double> start(s.params.begin(), s.params.end());
  const std::vector<double> want_update = difference(one.weights[0], start);
  for (int r = 0; r < k.dp * k.cp; ++r) {
    const StepResult& got = many.results[r][0];
    EXPECT_FALSE(got.skipped);
    // The PG loss is a mean of advantage-weighted ratios (|advantage| ~ 1) that can cancel to near 0: its rounding
    // scales with the terms, not with their sum (seen: 1.1e-5 relative on a loss of -0.004).
    EXPECT_NEAR(got.loss, want.loss, tol * std::max(std::abs(want.loss), 1.0)) << "rank " << r;
    EXPECT_NEAR(got.grad_norm, want.grad_norm, tol * want.grad_norm) << "rank " << r;
    EXPECT_EQ(got.valid_tokens, want.valid_tokens);
    EXPECT_EQ(got.valid_sequences, want.valid_sequences);
    EXPECT_EQ(got.lr, want.lr);
    ASSERT_EQ(got.metrics.size(), want.metrics.size());
    for (size_t m = 0; m < want.metrics.size(); ++m) {
      EXPECT_EQ(got.metrics[m].name, want.metrics[m].name);
      EXPECT_EQ(got.metrics[m].count, want.metrics[m].count) << want.metrics[m].name;
      EXPECT_NEAR(got.metrics[m].value, want.metrics[m].value, tol * std::max(1.0, std::abs(want.metrics[m].value)))
          << want.metrics[m].name << " rank " << r;
    }
    // Every rank the same loss and weights, bit for bit (one all-reduce / all-gather gives them all).
    EXPECT_EQ(std::memcmp(&got.loss, &many.results[0][0].loss, sizeof(double)), 0);
    EXPECT_EQ(many.weights[r], many.weights[0]) << "rank " << r;
  }
  EXPECT_LE(rel_l2(difference(many.weights[0], start), want_update), tol);
}

std::string mesh_case_name(const ::testing::TestParamInfo<std::tuple<LossKind, MeshCase>>& info) {
  const auto [kind, k] = info.param;
  const char* loss = kind == LossKind::NLL ? "nll" : kind == LossKind::ClippedPG ? "pg" : "dpo";
  return cat(loss, "_", k.dp, "x", k.cp, "_", dtype_name(k.dtype));
}

INSTANTIATE_TEST_SUITE_P(Losses, TrainerLosses, ::testing::Values(LossKind::NLL, LossKind::ClippedPG, LossKind::DPO));
INSTANTIATE_TEST_SUITE_P(
    Meshes, TrainerMesh,
    ::testing::Combine(::testing::Values(LossKind::NLL, LossKind::ClippedPG, LossKind::DPO),
                       ::testing::Values(MeshCase{1, 2, DType::F64}, MeshCase{2, 1, DType::F64},
                                         MeshCase{2, 2, DType::F64}, MeshCase{1, 4, DType::F64},
                                         MeshCase{2, 2, DType::F32}, MeshCase{2, 1, DType::F32})),
    mesh_case_name);

TEST(TrainerMeshShape, WorldMustBeDpTimesCp) {
  try {
    comm::run_ranks(4, std::chrono::seconds(10), [](comm::Communicator& c) { Mesh m(c, {3, 1}); });
    FAIL() << "a 3 x 1 mesh on 4 ranks was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dp 3 x cp 1 = 3 ranks, but the world has 4"), std::string::npos) << e.what();
  }
}

// Rank 2 of a 2 × 2 mesh writes a NaN into its gradient after the backward of the second step: every rank skips
// the step, reports it with a NaN norm, and its weights, master weights and moments are bitwise the ones after the
// first step; the schedule still steps.
TEST(TrainerSkip, NanOnOneRankSkipsTheStepEverywhere) {
  std::mt19937_64 rng(testing::fresh_seed());
  const TrainSetup s = testing::make_train_setup(LossKind::ClippedPG, rng);
  struct Snapshot {
    std::vector<float> weights;
    std::vector<char> master, exp_avg, exp_avg_sq;
  };
  const auto bytes = [](const Tensor& t) {
    const char* p = static_cast<const char*>(t.data());
    return std::vector<char>(p, p + t.nbytes());
  };
  std::vector<Snapshot> before(4), after(4);
  std::vector<StepResult> skipped(4);
  comm::run_ranks(4, std::chrono::seconds(60), [&](comm::Communicator& world) {
    const Mesh mesh(world, {2, 2});
    auto inner = model::make_policy(s.config, s.params, testing::train_policy_options(DType::F32, &mesh.cp_group()));
    testing::InjectingPolicy policy(*inner);
    Trainer trainer(s.cfg, policy, mesh);
    trainer.step(s.batch);
    const int r = world.rank();
    ShardState& sh = trainer.shard();
    before[r] = {policy.params(), bytes(sh.master), bytes(sh.exp_avg), bytes(sh.exp_avg_sq)};
    if (r == 2) policy.after_backward = [&] { static_cast<float*>(policy.grads().data)[3] = NAN; };
    skipped[r] = trainer.step(s.batch);
    after[r] = {policy.params(), bytes(sh.master), bytes(sh.exp_avg), bytes(sh.exp_avg_sq)};
    EXPECT_EQ(trainer.optimizer_steps(), 1);
    EXPECT_EQ(trainer.schedule_position(), 2);
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(skipped[r].skipped) << "rank " << r;
    EXPECT_TRUE(std::isnan(skipped[r].grad_norm)) << "rank " << r;
    EXPECT_EQ(after[r].weights, before[r].weights) << "rank " << r;
    EXPECT_EQ(after[r].master, before[r].master) << "rank " << r;
    EXPECT_EQ(after[r].exp_avg, before[r].exp_avg) << "rank " << r;
    EXPECT_EQ(after[r].exp_avg_sq, before[r].exp_avg_sq) << "rank " << r;
    EXPECT_FALSE(before[r].exp_avg.empty());
  }
}

// A batch whose sample masks leave no valid token moves nothing: no AdamW decay, no momentum step; the schedule steps.
TEST(TrainerSkip, ABatchWithNoValidTokenMovesNoWeight) {
  std::mt19937_64 rng(testing::fresh_seed());
  const TrainSetup s = testing::make_train_setup(LossKind::NLL, rng);
  TrainBatch empty = s.batch;
  std::fill(empty.sample_mask.begin(), empty.sample_mask.end(), 0);
  std::vector<std::vector<float>> before(2), after(2);
  std::vector<StepResult> results(2);
  comm::run_ranks(2, std::chrono::seconds(60), [&](comm::Communicator& world) {
    const Mesh mesh(world, {2, 1});
    auto policy = model::make_policy(s.config, s.params, testing::train_policy_options(DType::F32, &mesh.cp_group()));
    Trainer trainer(s.cfg, *policy, mesh);
    trainer.step(s.batch);  // moments that a step on nothing would decay
    before[world.rank()] = policy->params();
    results[world.rank()] = trainer.step(empty);
    after[world.rank()] = policy->params();
    EXPECT_EQ(trainer.optimizer_steps(), 1);
    EXPECT_EQ(trainer.schedule_position(), 2);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(results[r].skipped) << "rank " << r;
    EXPECT_EQ(results[r].valid_tokens, 0) << "rank " << r;
    EXPECT_EQ(after[r], before[r]) << "rank " << r;
  }
}

// A DPO pair whose masks differ, in the part of the second dp rank: every rank raises the same AgreedError (the
// group stays in step), and the next step runs on all of them.
TEST(TrainerErrors, ABadPairInOneRanksPartFailsEveryRankTogether) {
  std::mt19937_64 rng(testing::fresh_seed());
  const TrainSetup s = testing::make_train_setup(LossKind::DPO, rng);
  TrainBatch bad = s.batch;
  const size_t last_pair = bad.sample_mask.size() - 2;
  bad.sample_mask[last_pair] = 1, bad.sample_mask[last_pair + 1] = 0;
  std::vector<std::string> errors(4);
  std::vector<std::vector<float>> weights(4);
  comm::run_ranks(4, std::chrono::seconds(60), [&](comm::Communicator& world) {
    const Mesh mesh(world, {2, 2});
    auto policy = model::make_policy(s.config, s.params, testing::train_policy_options(DType::F32, &mesh.cp_group()));
    Trainer trainer(s.cfg, *policy, mesh);
    try {
      trainer.step(bad);
    } catch (const comm::AgreedError& e) {
      errors[world.rank()] = e.what();
    }
    EXPECT_FALSE(trainer.step(s.batch).skipped);
    weights[world.rank()] = policy->params();
  });
  const std::string pair = "DPO pair " + std::to_string(last_pair / 2) + " (sequences " + std::to_string(last_pair);
  for (int r = 0; r < 4; ++r) {
    EXPECT_NE(errors[r].find(pair), std::string::npos) << "rank " << r << ": " << errors[r];
    EXPECT_EQ(weights[r], weights[0]) << "rank " << r;
  }
}

}  // namespace
}  // namespace ringtrain::train

namespace ringtrain::train {
namespace {

// A CPU policy that offers the gradients' sum of squares beside its backward (as the GPU policy does): the backward
// after a request writes 4 x the true sum there, so a trainer that took it reports twice the norm. It counts the
// requests and the backwards of each step (zero_grads() starts a step).
class SquaresOfferingPolicy final : public testing::ForwardingPolicy {
 public:
  using ForwardingPolicy::ForwardingPolicy;
  int asks = 0, backwards = 0, answered_at = -1;

  bool sum_grad_squares_in_next_backward(double* device_result) override {
    ++asks;
    pending_ = device_result;
    return true;
  }
  void backward(const std::vector<std::vector<float>>& d) override {
    inner_.backward(d);
    ++backwards;
    if (!pending_) return;
    const TensorView g = inner_.grads();
    double sum = 0;
    for (int64_t i = 0; i < g.numel(); ++i) {
      const double x = g.dtype == DType::F64 ? g.ptr<double>()[i] : g.ptr<float>()[i];
      sum += x * x;
    }
    *pending_ = 4 * sum;
    pending_ = nullptr;
    answered_at = backwards;
  }
  void zero_grads() override {
    inner_.zero_grads();
    pending_ = nullptr;
    asks = backwards = 0, answered_at = -1;
  }

 private:
  double* pending_ = nullptr;
};

// With one rank the trainer asks such a policy once per step, just before the step's last backward, and reports the
// norm of the sum it gets (twice a plain policy's norm on the same batch, to fp64 rounding); with dp = 2, where the
// gradients are reduced after the backward, it never asks and sums them itself.
TEST(TrainerNorm, OneRankTakesTheSumFromTheLastBackwardAndMoreRanksNeverAsk) {
  std::mt19937_64 rng(testing::fresh_seed());
  const TrainSetup s = testing::make_train_setup(LossKind::NLL, rng);
  for (int dp : {1, 2}) {
    std::vector<StepResult> offered(2), plain(2);
    std::vector<int> asks(2), backwards(2), answered_at(2);
    comm::run_ranks(dp, std::chrono::seconds(60), [&](comm::Communicator& world) {
      const Mesh mesh(world, {dp, 1});
      const auto options = testing::train_policy_options(DType::F64, &mesh.cp_group());
      const auto inner = model::make_policy(s.config, s.params, options);
      const auto reference = model::make_policy(s.config, s.params, options);
      SquaresOfferingPolicy policy(*inner);
      Trainer with_offer(s.cfg, policy, mesh), without(s.cfg, *reference, mesh);
      const int r = world.rank();
      offered[r] = with_offer.step(s.batch);
      plain[r] = without.step(s.batch);
      asks[r] = policy.asks, backwards[r] = policy.backwards, answered_at[r] = policy.answered_at;
    });
    for (int r = 0; r < dp; ++r) {
      const std::string what = "dp " + std::to_string(dp) + " rank " + std::to_string(r);
      ASSERT_GT(plain[r].grad_norm, 0) << what;
      ASSERT_GE(backwards[r], 2) << what << ": the batch must take several microbatches";
      if (dp == 1) {
        EXPECT_EQ(asks[r], 1) << what;
        EXPECT_EQ(answered_at[r], backwards[r]) << what << ": answered by another backward than the last";
        EXPECT_NEAR(offered[r].grad_norm, 2 * plain[r].grad_norm, 1e-12 * plain[r].grad_norm) << what;
      } else {
        EXPECT_EQ(asks[r], 0) << what;
        EXPECT_NEAR(offered[r].grad_norm, plain[r].grad_norm, 1e-12 * plain[r].grad_norm) << what;
      }
    }
  }
}

// Device rows are for a GPU policy: a CPU policy's batch is host memory already (step(TrainBatch)).
TEST(TrainerRows, NeedAGpuPolicy) {
  std::mt19937_64 rng(testing::fresh_seed());
  const testing::TrainSetup s = testing::make_train_setup(LossKind::NLL, rng, 2);
  const auto world = comm::make_in_process_group(1, std::chrono::seconds(10));
  const Mesh mesh(*world[0], {1, 1});
  const auto policy = model::make_policy(s.config, s.params, testing::train_policy_options(DType::F32, nullptr));
  Trainer trainer(s.cfg, *policy, mesh);
  std::vector<int32_t> ids(2 * 4, 1);
  TrainRows rows;
  rows.ids = contiguous_view(ids.data(), DType::I32, Device::cpu(), {2, 4});
  rows.lengths = {4, 3};
  try {
    trainer.step(rows);
    ADD_FAILURE() << "a CPU policy took device rows";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs a GPU policy"), std::string::npos) << e.what();
  }
  EXPECT_EQ(trainer.steps_taken(), 0);
}

}  // namespace
}  // namespace ringtrain::train
