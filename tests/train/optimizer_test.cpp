// AdamW against an independent fp64 reference (3 steps, clipping on one, a warm-up + cosine schedule, two ZeRO
// shards), determinism, skipped steps on non-finite norms, checkpoint round trips and hand-computed schedules.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "ringtrain/core/error.h"
#include "ringtrain/train/optimizer.h"
#include "ringtrain/train/schedule.h"
#include "host_adamw.h"
#include "test_util.h"

namespace ringtrain::train {
namespace {

// AdamW from its textbook form (Loshchilov & Hutter, PyTorch's decoupled decay), fp64, on the whole vector:
// g ← g·min(1, max_norm/(‖g‖ + 1e-6)); m ← β1 m + (1-β1) g; v ← β2 v + (1-β2) g²;
// p ← p - lr·wd·p - lr·m̂/(√v̂ + ε) with m̂ = m/(1-β1ᵗ), v̂ = v/(1-β2ᵗ).
struct ReferenceAdamW {
  AdamWConfig cfg;
  std::vector<double> p, m, v;
  std::vector<double> m_abs;  // m of |g|: the size of the terms that m sums, for error bounds under cancellation
  int t = 0;
  double step(std::vector<double> g, double lr) {
    double sq = 0;
    for (double x : g) sq += x * x;
    const double coef = std::min(1.0, cfg.max_grad_norm / (std::sqrt(sq) + 1e-6));
    ++t;
    for (size_t i = 0; i < p.size(); ++i) {
      const double gi = g[i] * coef;
      m[i] = cfg.beta1 * m[i] + (1 - cfg.beta1) * gi;
      m_abs[i] = cfg.beta1 * m_abs[i] + (1 - cfg.beta1) * std::abs(gi);
      v[i] = cfg.beta2 * v[i] + (1 - cfg.beta2) * gi * gi;
      const double m_hat = m[i] / (1 - std::pow(cfg.beta1, t)), v_hat = v[i] / (1 - std::pow(cfg.beta2, t));
      p[i] = p[i] - lr * cfg.weight_decay * p[i] - lr * m_hat / (std::sqrt(v_hat) + cfg.eps);
    }
    return coef;
  }
};

ScheduleConfig warmup_cosine() {
  ScheduleConfig s;
  s.base_lr = 1e-2;
  s.warmup_steps = 2;
  s.warmup_start_factor = 0.5;
  s.decay = ScheduleConfig::Decay::Cosine;
  s.decay_steps = 4;
  s.min_lr = 1e-3;
  return s;
}

// Gradients of step k (0-based): stddev 0.01 (norm ≈ 0.3 < max_norm 1) except on step 1, stddev 1 (norm ≈ 30):
// clipping is active on exactly that step.
std::vector<std::vector<double>> three_steps_of_gradients(std::mt19937_64& rng, int64_t n) {
  std::normal_distribution<double> nd(0, 1);
  std::vector<std::vector<double>> g(3, std::vector<double>(n));
  for (int k = 0; k < 3; ++k)
    for (auto& x : g[k]) x = nd(rng) * (k == 1 ? 1.0 : 0.01);
  return g;
}

// Runs the shards [0, split) and [split, n) as two ranks would, with the global sum of squares summed from theirs.
template <typename M>
void run_two_shards(const AdamWConfig& cfg, std::vector<M>& master, const std::vector<std::vector<double>>& grads,
                    int64_t split, std::vector<AdamWStep>& steps, std::vector<M>& m_out, std::vector<M>& v_out) {
  const int64_t n = static_cast<int64_t>(master.size());
  AdamW<M> a(cfg, 0, split), b(cfg, split, n);
  LRSchedule schedule(warmup_cosine());
  for (const auto& g64 : grads) {
    const std::vector<M> g(g64.begin(), g64.end());
    std::span<const M> ga(g.data(), split), gb(g.data() + split, n - split);
    const double sq = sum_of_squares(ga) + sum_of_squares(gb);  // the trainer's all-reduce
    steps.push_back(a.step(std::span<M>(master.data(), split), ga, schedule.lr(), sq));
    b.step(std::span<M>(master.data() + split, n - split), gb, schedule.lr(), sq);
    schedule.step();
  }
  m_out.assign(a.exp_avg().begin(), a.exp_avg().end());
  m_out.insert(m_out.end(), b.exp_avg().begin(), b.exp_avg().end());
  v_out.assign(a.exp_avg_sq().begin(), a.exp_avg_sq().end());
  v_out.insert(v_out.end(), b.exp_avg_sq().begin(), b.exp_avg_sq().end());
}

TEST(AdamW, MatchesAnFp64ReferenceOverThreeStepsWithClippingAndASchedule) {
  std::mt19937_64 rng(testing::fresh_seed());
  const int64_t n = 1000, split = 389;
  AdamWConfig cfg;
  cfg.weight_decay = 0.1;
  const auto grads = three_steps_of_gradients(rng, n);
  std::normal_distribution<double> nd(0, 1);
  ReferenceAdamW ref{cfg, std::vector<double>(n), std::vector<double>(n, 0.0), std::vector<double>(n, 0.0),
                     std::vector<double>(n, 0.0)};
  for (auto& x : ref.p) x = static_cast<float>(nd(rng));  // fp32-representable so both paths start equal
  const std::vector<double> start = ref.p;
  std::vector<double> coefs, lrs;
  for (int k = 0; k < 3; ++k) {
    lrs.push_back(lr_at(warmup_cosine(), k));
    coefs.push_back(ref.step(grads[k], lrs.back()));
  }
  ASSERT_EQ(coefs[0], 1);
  ASSERT_LT(coefs[1], 0.1);
  ASSERT_EQ(coefs[2], 1);

  // fp64 master: the same math in another order; differences are a few ulps of each term (1e-13 relative).
  std::vector<double> p64 = start, m64, v64;
  std::vector<AdamWStep> steps;
  run_two_shards<double>(cfg, p64, grads, split, steps, m64, v64);
  for (int k = 0; k < 3; ++k) {
    EXPECT_FALSE(steps[k].skipped);
    EXPECT_EQ(steps[k].step, k + 1);
    EXPECT_EQ(steps[k].lr, lrs[k]);
    EXPECT_NEAR(steps[k].clip_coef, coefs[k], 1e-14);
  }
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_NEAR(p64[i], ref.p[i], 1e-13 * (1 + std::abs(ref.p[i]))) << i;
    ASSERT_NEAR(m64[i], ref.m[i], 1e-13 * ref.m_abs[i]) << i;
    ASSERT_NEAR(v64[i], ref.v[i], 1e-13 * std::abs(ref.v[i])) << i;
  }

  // fp32 master and moments: each step rounds every quantity to fp32 (relative 6e-8 each, ~10 operations), over 3
  // steps a few 1e-7 relative in v and in the terms that m sums (m_abs: m itself may cancel). The update m̂/(√v̂+ε) is near ±1 per step, times lr ≤ 1e-2, so its fp32
  // error is < 1e-8 absolute, below the rounding of p itself (|p| ~ 1: 6e-8 per step).
  std::vector<float> p32(start.begin(), start.end()), m32, v32;
  steps.clear();
  run_two_shards<float>(cfg, p32, grads, split, steps, m32, v32);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_NEAR(p32[i], ref.p[i], 4e-7 * (1 + std::abs(ref.p[i]))) << i;
    ASSERT_NEAR(m32[i], ref.m[i], 1e-6 * ref.m_abs[i]) << i;
    ASSERT_NEAR(v32[i], ref.v[i], 1e-6 * std::abs(ref.v[i])) << i;
  }
}

TEST(AdamW, Fp32PathIsBitwiseReproducibleAndWritesBf16ComputeWeights) {
  std::mt19937_64 rng(testing::fresh_seed());
  const int64_t n = 777;
  const auto grads = three_steps_of_gradients(rng, n);
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> start(n);
  for (auto& x : start) x = nd(rng);
  auto run = [&](std::vector<float>& p, std::vector<uint16_t>& bf16) {
    AdamW<float> opt({}, 100, 100 + n);
    for (int k = 0; k < 3; ++k) {
      const std::vector<float> g(grads[k].begin(), grads[k].end());
      opt.step(p, g, lr_at(warmup_cosine(), k), sum_of_squares<float>(g), {bf16.data(), DType::BF16});
    }
    return std::vector<float>(opt.exp_avg_sq().begin(), opt.exp_avg_sq().end());
  };
  std::vector<float> p1 = start, p2 = start;
  std::vector<uint16_t> c1(n, 0xffff), c2(n, 0xffff);  // 0xffff: a NaN bit pattern
  const auto v1 = run(p1, c1), v2 = run(p2, c2);
  EXPECT_EQ(std::memcmp(p1.data(), p2.data(), n * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(v1.data(), v2.data(), n * sizeof(float)), 0);
  EXPECT_EQ(c1, c2);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(c1[i], float_to_bf16(p1[i])) << i;
  EXPECT_NE(p1, start);
}

TEST(AdamW, NonFiniteNormSkipsTheStepAndChangesNothing) {
  std::mt19937_64 rng(testing::fresh_seed());
  const int64_t n = 64;
  const auto grads = three_steps_of_gradients(rng, n);
  std::vector<float> p(n, 0.5f), g(grads[0].begin(), grads[0].end());
  std::vector<uint16_t> compute(n, 0);
  AdamW<float> opt({}, 0, n);
  opt.step(p, g, 1e-3, sum_of_squares<float>(g), {compute.data(), DType::BF16});
  const auto p_before = p;
  const std::vector<float> m_before(opt.exp_avg().begin(), opt.exp_avg().end());
  const std::vector<float> v_before(opt.exp_avg_sq().begin(), opt.exp_avg_sq().end());
  const auto compute_before = compute;
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<float> nan_grad = g;
  nan_grad[17] = std::nanf("");
  for (double sq : {std::numeric_limits<double>::quiet_NaN(), inf, sum_of_squares<float>(nan_grad)}) {
    const AdamWStep s = opt.step(p, nan_grad, 1e-3, sq, {compute.data(), DType::BF16});
    EXPECT_TRUE(s.skipped);
    EXPECT_EQ(opt.completed_steps(), 1);
    EXPECT_EQ(std::memcmp(p.data(), p_before.data(), n * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(opt.exp_avg().data(), m_before.data(), n * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(opt.exp_avg_sq().data(), v_before.data(), n * sizeof(float)), 0);
    EXPECT_EQ(compute, compute_before);
  }
  // The next finite step is step 2 (bias corrections of t = 2).
  const AdamWStep s = opt.step(p, g, 1e-3, sum_of_squares<float>(g));
  EXPECT_FALSE(s.skipped);
  EXPECT_EQ(s.step, 2);
  EXPECT_DOUBLE_EQ(s.step_size, 1e-3 / (1 - 0.9 * 0.9));
}

TEST(AdamW, StateRoundTripContinuesBitwise) {
  std::mt19937_64 rng(testing::fresh_seed());
  const int64_t n = 300;
  const auto grads = three_steps_of_gradients(rng, n);
  std::vector<std::vector<float>> g;
  for (const auto& x : grads) g.emplace_back(x.begin(), x.end());
  std::vector<float> straight(n, 0.25f);
  AdamW<float> a({}, 0, n);
  for (int k = 0; k < 3; ++k) a.step(straight, g[k], 1e-3, sum_of_squares<float>(g[k]));

  std::vector<float> resumed(n, 0.25f);
  AdamW<float> b({}, 0, n);
  b.step(resumed, g[0], 1e-3, sum_of_squares<float>(g[0]));
  AdamW<float> c({}, 0, n);
  c.load_state(b.completed_steps(), b.exp_avg(), b.exp_avg_sq());
  for (int k = 1; k < 3; ++k) c.step(resumed, g[k], 1e-3, sum_of_squares<float>(g[k]));
  EXPECT_EQ(std::memcmp(straight.data(), resumed.data(), n * sizeof(float)), 0);
  EXPECT_EQ(c.completed_steps(), 3);
  EXPECT_THROW(c.load_state(1, a.exp_avg().subspan(1), a.exp_avg_sq()), Error);
}

TEST(AdamW, BadInputsAreErrors) {
  AdamWConfig bad;
  bad.beta2 = 1.0;
  EXPECT_THROW(AdamW<float>(bad, 0, 4), Error);
  EXPECT_THROW(AdamW<float>({}, 4, 2), Error);
  AdamW<float> opt({}, 0, 4);
  std::vector<float> p(4), g(3);
  EXPECT_THROW(opt.step(p, g, 1e-3, 1.0), Error);
  g.resize(4);
  EXPECT_THROW(opt.step(p, g, std::nan(""), 1.0), Error);
  EXPECT_THROW(opt.step(p, g, 1e-3, -1.0), Error);
  EXPECT_THROW(opt.step(p, g, 1e-3, 1.0, {p.data(), DType::I32}), Error);
}

TEST(Schedule, WarmupThenCosineHandComputed) {
  // base 1e-3, warm-up 4 steps from factor 0.2: 0.2, 0.4, 0.6, 0.8 of base; then cosine over 4 steps to 1e-4:
  // min + (base - min)·(1 + cos(π·t/4))/2 = 1e-3, 8.681981e-4 (cos π/4 = 0.7071068), 5.5e-4, 2.318019e-4, 1e-4.
  ScheduleConfig cfg;
  cfg.base_lr = 1e-3;
  cfg.warmup_steps = 4;
  cfg.warmup_start_factor = 0.2;
  cfg.decay = ScheduleConfig::Decay::Cosine;
  cfg.decay_steps = 4;
  cfg.min_lr = 1e-4;
  const double expected[] = {2e-4, 4e-4, 6e-4, 8e-4, 1e-3, 8.681981e-4, 5.5e-4, 2.318019e-4, 1e-4, 1e-4};
  LRSchedule s(cfg);
  for (double e : expected) {
    EXPECT_NEAR(s.lr(), e, 1e-10) << "position " << s.position();
    s.step();
  }
  EXPECT_NEAR(lr_at(cfg, 1000), 1e-4, 1e-18);
  s.set_position(2);
  EXPECT_NEAR(s.lr(), 6e-4, 1e-18);
}

TEST(Schedule, WarmupThenConstantAndBadConfigs) {
  ScheduleConfig cfg;
  cfg.base_lr = 5e-6;
  cfg.warmup_steps = 10;
  cfg.warmup_start_factor = 0.1;
  EXPECT_DOUBLE_EQ(lr_at(cfg, 0), 5e-7);
  EXPECT_DOUBLE_EQ(lr_at(cfg, 5), 5e-6 * 0.55);
  EXPECT_DOUBLE_EQ(lr_at(cfg, 10), 5e-6);
  EXPECT_DOUBLE_EQ(lr_at(cfg, 99999), 5e-6);
  cfg.warmup_start_factor = 1.5;
  EXPECT_THROW(LRSchedule{cfg}, Error);
  cfg.warmup_start_factor = 0.1;
  cfg.decay = ScheduleConfig::Decay::Cosine;
  EXPECT_THROW(LRSchedule{cfg}, Error);  // no decay_steps
  cfg.decay_steps = 5;
  cfg.min_lr = 1.0;
  EXPECT_THROW(LRSchedule{cfg}, Error);  // min_lr above base_lr
}

}  // namespace
}  // namespace ringtrain::train
