// Losses against hand-derived values, finite differences (fp64), microbatch splitting and NaN propagation.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "ringtrain/core/error.h"
#include "ringtrain/train/losses.h"
#include "test_util.h"

namespace ringtrain::train {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Owns the masks of a [batch, seq] microbatch.
struct Masks {
  int64_t batch, seq;
  std::vector<uint8_t> token, sample;
  Masks(int64_t b, int64_t s) : batch(b), seq(s), token(b * s, 1), sample(b, 1) {}
  TokenMasks view() const { return {batch, seq, token, sample}; }
  // Rows [first, first + count) as their own microbatch.
  Masks rows(int64_t first, int64_t count) const {
    Masks m(count, seq);
    std::copy(token.begin() + first * seq, token.begin() + (first + count) * seq, m.token.begin());
    std::copy(sample.begin() + first, sample.begin() + first + count, m.sample.begin());
    return m;
  }
};

std::vector<double> rows_of(const std::vector<double>& v, int64_t seq, int64_t first, int64_t count) {
  return {v.begin() + first * seq, v.begin() + (first + count) * seq};
}

double metric(const LossResult& r, const std::string& name) {
  for (const auto& m : r.metrics)
    if (m.name == name) return m.sum / m.count;
  ADD_FAILURE() << "no metric " << name;
  return kNaN;
}

std::vector<double> poisoned(size_t n) { return std::vector<double>(n, kNaN); }

// ---- hand-computed cases ----

TEST(Losses, NllHandComputed) {
  // Row 0: positions 1, 2 count (position 0 never does, whatever the mask says). Row 1: only position 1.
  Masks m(2, 3);
  m.token = {1, 1, 1, 1, 1, 0};
  const std::vector<double> lp = {9, -1, -2, 7, -0.5, -3};
  // 3 counted tokens here, 6 in the whole step: loss = -(-1 - 2 - 0.5) / 6 = 3.5 / 6.
  const ValidCounts local = count_valid(m.view());
  EXPECT_EQ(local.tokens, 3);
  EXPECT_EQ(local.sequences, 2);
  auto grad = poisoned(6);
  const LossResult r = nll_loss<double>(m.view(), lp, {6, 4}, grad);
  EXPECT_NEAR(r.loss, 3.5 / 6, 1e-15);
  const double g = -1.0 / 6;
  EXPECT_EQ(grad, (std::vector<double>{0, g, g, 0, g, 0}));
}

TEST(Losses, ClippedPGHandComputed) {
  // One sequence, positions 1..4, eps 0.2 (clip range [0.8, 1.2]), dual clip c = 3, prev = 0 so r = exp(cur):
  //  p1: r = 1.5, A = 1:  -A·r = -1.5 < -A·1.2 = -1.2  -> clipped, loss -1.2, grad 0
  //  p2: r = 0.5, A = 1:  -0.5 > -0.8                  -> unclipped, loss -0.5, grad -A·r = -0.5
  //  p3: r = 0.5, A = -2: 1.0 < 2·0.8 = 1.6            -> clipped, loss 1.6, grad 0 (1.6 < -A·c = 6: no dual)
  //  p4: r = 4,   A = -1: 4 > 1.2 -> unclipped 4, then min(4, -A·c = 3) -> dual clipped, loss 3, grad 0
  // Sum 2.9 over 4 tokens (global 4): loss 0.725; grad at p2 -0.5/4.
  Masks m(1, 5);
  const std::vector<double> cur = {0, std::log(1.5), std::log(0.5), std::log(0.5), std::log(4.0)};
  const std::vector<double> prev(5, 0.0), adv = {0, 1, 1, -2, -1};
  ClippedPGConfig cfg;
  cfg.dual_clip = 3;
  auto grad = poisoned(5);
  const LossResult r = clipped_pg_loss<double>(m.view(), {cur, prev, adv}, cfg, {4, 1}, grad);
  EXPECT_NEAR(r.loss, 0.725, 1e-15);
  EXPECT_EQ(grad[0], 0);
  EXPECT_EQ(grad[1], 0);
  EXPECT_NEAR(grad[2], -0.125, 1e-16);
  EXPECT_EQ(grad[3], 0);
  EXPECT_EQ(grad[4], 0);
  EXPECT_DOUBLE_EQ(metric(r, "clip_fraction"), 0.5);  // p1, p3
  EXPECT_DOUBLE_EQ(metric(r, "dual_clip_fraction"), 0.25);
  EXPECT_DOUBLE_EQ(metric(r, "ratio"), 6.5 / 4);
  // k3 of KL(prev || cur) with x = cur - prev = log r: r - 1 - log r =
  // 0.0945349 (r=1.5), 0.1931472 (r=0.5, twice), 1.6137056 (r=4); mean 2.0945349/4.
  EXPECT_NEAR(metric(r, "approx_kl"), (0.09453489 + 2 * 0.19314718 + 1.61370564) / 4, 1e-8);
}

TEST(Losses, ClippedPGWithoutDualClipKeepsTheUnboundedBranch) {
  // p4 of the case above without the dual clip: loss 4 and grad -A·r = 4 (global 1 token).
  Masks m(1, 2);
  const std::vector<double> cur = {0, std::log(4.0)}, prev = {0, 0}, adv = {0, -1};
  auto grad = poisoned(2);
  const LossResult r = clipped_pg_loss<double>(m.view(), {cur, prev, adv}, {}, {1, 1}, grad);
  EXPECT_NEAR(r.loss, 4, 1e-14);
  EXPECT_NEAR(grad[1], 4, 1e-14);
}

TEST(Losses, KLEstimatorsAndClamps) {
  // A = 0 and prev = cur isolate the KL term; beta = 0.5, x = ref - cur per position:
  //  K3, x = 1:   k = e - 2 = 0.7182818, dk/dcur = -(e - 1) = -1.7182818
  //  K3, x = 3:   k = e³ - 4 = 16.09 > 10 -> 10, grad 0
  //  K3, x = 25:  x clamped to 20, k clamped to 10, grad 0
  //  K3, x = -25: x clamped to -20, k = e⁻²⁰ + 19 -> 10, grad 0
  // Token loss = beta·k; 4 tokens, global 4.
  Masks m(1, 5);
  const std::vector<double> cur = {0, 0.5, 0.5, 0.5, 0.5};
  const std::vector<double> ref = {0, 1.5, 3.5, 25.5, -24.5};
  const std::vector<double> adv(5, 0.0);
  ClippedPGConfig cfg;
  cfg.kl_beta = 0.5;
  auto grad = poisoned(5);
  LossResult r = clipped_pg_loss<double>(m.view(), {cur, cur, adv, ref}, cfg, {4, 1}, grad);
  const double e = std::exp(1.0);
  EXPECT_NEAR(r.loss, 0.5 * (e - 2 + 30) / 4, 1e-14);
  EXPECT_NEAR(grad[1], 0.5 * -(e - 1) / 4, 1e-15);
  EXPECT_EQ(grad[2], 0);
  EXPECT_EQ(grad[3], 0);
  EXPECT_EQ(grad[4], 0);
  EXPECT_NEAR(metric(r, "ref_kl"), (e - 2 + 30) / 4, 1e-14);

  // K1, x = -5: k = 5, dk/dcur = +1.  K2, x = 2: k = 2, dk/dcur = -x = -2.  One token each, global 1, beta 0.5.
  Masks one(1, 2);
  cfg.kl_estimator = KLEstimator::K1;
  const std::vector<double> c1 = {0, 1}, r1 = {0, -4}, a1 = {0, 0};
  grad = poisoned(2);
  r = clipped_pg_loss<double>(one.view(), {c1, c1, a1, r1}, cfg, {1, 1}, grad);
  EXPECT_NEAR(r.loss, 2.5, 1e-15);
  EXPECT_NEAR(grad[1], 0.5, 1e-15);
  cfg.kl_estimator = KLEstimator::K2;
  const std::vector<double> r2 = {0, 3};
  r = clipped_pg_loss<double>(one.view(), {c1, c1, a1, r2}, cfg, {1, 1}, grad);
  EXPECT_NEAR(r.loss, 1.0, 1e-15);
  EXPECT_NEAR(grad[1], -1.0, 1e-15);
}

TEST(Losses, ImportanceWeightsAndSequenceMean) {
  // r = 1 everywhere (cur = prev), no clipping: token loss = -A·w, grad -A·w.
  // Row 0: one token, A = 1, gen = prev + log 2 -> w = exp(prev - gen) = 0.5: mean -0.5.
  // Row 1: A = 1, 2, 3 with w = 1: mean -2.
  // Sequence mean over 2 global sequences: (-0.5 - 2) / 2 = -1.25;
  // grads: row 0: -0.5 / (1·2) = -0.25; row 1: -A / (3·2).
  Masks m(2, 4);
  m.token = {0, 1, 0, 0, 0, 1, 1, 1};
  const std::vector<double> cur(8, -1.0), adv = {0, 1, 0, 0, 0, 1, 2, 3};
  std::vector<double> gen(8, -1.0);
  gen[1] = -1.0 + std::log(2.0);
  ClippedPGConfig cfg;
  cfg.aggregation = Aggregation::SequenceMean;
  auto grad = poisoned(8);
  const LossResult r = clipped_pg_loss<double>(m.view(), {cur, cur, adv, {}, gen}, cfg, {4, 2}, grad);
  EXPECT_NEAR(r.loss, -1.25, 1e-15);
  EXPECT_NEAR(grad[1], -0.25, 1e-15);
  EXPECT_NEAR(grad[5], -1.0 / 6, 1e-15);
  EXPECT_NEAR(grad[6], -2.0 / 6, 1e-15);
  EXPECT_NEAR(grad[7], -3.0 / 6, 1e-15);
  EXPECT_NEAR(metric(r, "importance_weight"), (0.5 + 3) / 4, 1e-15);
}

TEST(Losses, SequenceMeanCountsASampledSequenceWithoutCountedTokens) {
  // NeMo RL divides the sum of per-sequence means by Σ sample_mask. Row 0 counts tokens 1, 2 (A = 1, 3: mean -2);
  // row 1 is sampled but every token is masked (adds 0, counts 1); row 2 is not sampled (counts 0): loss -2 / 2.
  Masks m(3, 3);
  m.token = {1, 1, 1, 1, 0, 0, 1, 1, 1};
  m.sample = {1, 1, 0};
  const ValidCounts local = count_valid(m.view());
  EXPECT_EQ(local.tokens, 2);
  EXPECT_EQ(local.sequences, 2);
  const std::vector<double> cur(9, -1.0), adv = {0, 1, 3, 5, 5, 5, 7, 7, 7};
  ClippedPGConfig cfg;
  cfg.aggregation = Aggregation::SequenceMean;
  auto grad = poisoned(9);
  const LossResult r = clipped_pg_loss<double>(m.view(), {cur, cur, adv, {}, {}}, cfg, local, grad);
  EXPECT_NEAR(r.loss, -1.0, 1e-15);
  EXPECT_EQ(grad, (std::vector<double>{0, -1.0 / 4, -3.0 / 4, 0, 0, 0, 0, 0, 0}));
}

TEST(Losses, ImportanceWeightsCorrectThePolicyGradientOnly) {
  // r = 1 (cur = prev = -1), A = 1, beta = 0.5, k3, two tokens, global 2.
  //  p1: w = 0.5 (gen = prev + log 2), x = ref - cur = 1: loss -w + beta(e - 2), grad -w - beta(e - 1): the KL term
  //      keeps its full weight;
  //  p2: gen = -1000, so exp(prev - gen) overflows: w = 0 and the token's policy gradient drops out (ref = cur: no KL).
  Masks m(1, 3);
  const std::vector<double> cur(3, -1.0), adv = {0, 1, 1}, ref = {0, 0, -1}, gen = {0, -1 + std::log(2.0), -1000};
  ClippedPGConfig cfg;
  cfg.kl_beta = 0.5;
  auto grad = poisoned(3);
  const LossResult r = clipped_pg_loss<double>(m.view(), {cur, cur, adv, ref, gen}, cfg, {2, 1}, grad);
  const double e = std::exp(1.0);
  EXPECT_NEAR(r.loss, (-0.5 + 0.5 * (e - 2)) / 2, 1e-15);
  EXPECT_NEAR(grad[1], (-0.5 - 0.5 * (e - 1)) / 2, 1e-15);
  EXPECT_EQ(grad[2], 0);
  EXPECT_NEAR(metric(r, "importance_weight"), 0.5 / 2, 1e-15);
  const TokenLocalGradient local = TokenLocalGradient::clipped_pg<double>(m.view(), {{}, cur, adv, ref, gen}, cfg,
                                                                          {2, 1});
  EXPECT_EQ(local(0, 1, -1.0), grad[1]);
  EXPECT_EQ(local(0, 2, -1.0), 0);
}

TEST(Losses, EntropyMetricIsTheMeanOverCountedTokens) {
  Masks m(1, 4);
  m.token = {1, 1, 0, 1};  // positions 1, 3 count
  const std::vector<double> z(4, 0.0), entropy = {100, 2, 100, 4};
  auto grad = poisoned(4);
  const LossResult r = clipped_pg_loss<double>(m.view(), {z, z, z, {}, {}, entropy}, {}, {2, 1}, grad);
  EXPECT_DOUBLE_EQ(metric(r, "entropy"), 3);
}

TEST(Losses, DPOHandComputed) {
  // beta = 0.5. Chosen: logπ - logπ_ref = 0.5 + 0.5 -> r_c = 1; rejected: 0 + (-1) -> r_r = -1.
  // z = 0.5·(1 - (-1)) = 1; loss = softplus(-1) = log(1 + e⁻¹) = 0.31326169;
  // dz: -sigmoid(-1)·beta = -0.26894142·0.5 = -0.13447071 on chosen tokens, +0.13447071 on rejected ones.
  Masks m(2, 3);
  const std::vector<double> lp = {0, -1, -2, 0, -1, -3}, ref = {0, -1.5, -2.5, 0, -1, -2};
  DPOConfig cfg;
  cfg.beta = 0.5;
  auto grad = poisoned(6);
  LossResult r = dpo_loss<double>(m.view(), lp, ref, cfg, {1, 2}, grad);
  EXPECT_NEAR(r.loss, 0.31326169, 1e-8);
  EXPECT_NEAR(grad[1], -0.13447071, 1e-8);
  EXPECT_NEAR(grad[2], -0.13447071, 1e-8);
  EXPECT_NEAR(grad[4], 0.13447071, 1e-8);
  EXPECT_EQ(grad[0], 0);
  EXPECT_EQ(grad[3], 0);
  EXPECT_EQ(metric(r, "reward_accuracy"), 1);
  EXPECT_DOUBLE_EQ(metric(r, "reward_margin"), 2);
  EXPECT_DOUBLE_EQ(metric(r, "chosen_reward"), 1);
  EXPECT_DOUBLE_EQ(metric(r, "rejected_reward"), -1);

  // With the NLL term (coef 0.1): the chosen answer's summed NLL over the pairs (1), not its mean over the 2 chosen
  // tokens: + 0.1·(1 + 2)/1 = 0.3; chosen grads -0.1 more.
  cfg.nll_coef = 0.1;
  r = dpo_loss<double>(m.view(), lp, ref, cfg, {1, 2}, grad);
  EXPECT_NEAR(r.loss, 0.31326169 + 0.3, 1e-8);
  EXPECT_NEAR(grad[1], -0.13447071 - 0.1, 1e-8);
  EXPECT_NEAR(grad[4], 0.13447071, 1e-8);
  EXPECT_DOUBLE_EQ(metric(r, "chosen_nll"), 1.5);
}

TEST(Losses, DPOLargeMarginsDoNotOverflow) {
  // beta·Δ = ±1000: softplus(-1000) = 0 (to double precision), softplus(1000) = 1000; sigmoid saturates to 0 / 1.
  Masks m(2, 2);
  const std::vector<double> ref(4, 0.0);
  auto grad = poisoned(4);
  LossResult r = dpo_loss<double>(m.view(), std::vector<double>{0, 500, 0, -500}, ref, {1.0, 0}, {1, 1}, grad);
  EXPECT_EQ(r.loss, 0);
  EXPECT_EQ(grad[1], 0);
  r = dpo_loss<double>(m.view(), std::vector<double>{0, -500, 0, 500}, ref, {1.0, 0}, {1, 1}, grad);
  EXPECT_DOUBLE_EQ(r.loss, 1000);
  EXPECT_DOUBLE_EQ(grad[1], -1);
  EXPECT_DOUBLE_EQ(grad[3], 1);
  EXPECT_EQ(metric(r, "reward_accuracy"), 0);
}

// ---- random inputs: finite differences and microbatch splitting ----

struct RandomBatch {
  Masks masks;
  std::vector<double> cur, prev, adv, ref, gen, entropy;
  RandomBatch(int64_t batch, int64_t seq, std::mt19937_64& rng) : masks(batch, seq) {
    std::normal_distribution<double> nd(0, 1);
    std::bernoulli_distribution keep(0.8);
    const int64_t n = batch * seq;
    for (auto& t : masks.token) t = keep(rng);
    for (int64_t i = 0; i < n; ++i) {
      cur.push_back(-1.5 + 0.5 * nd(rng));
      prev.push_back(cur.back() + 0.3 * nd(rng));  // ratios around 1, many outside [0.8, 1.2]
      adv.push_back(nd(rng));
      ref.push_back(cur.back() + 1.2 * nd(rng));  // some k3 values above the clamp at 10
      gen.push_back(prev.back() + 0.2 * nd(rng));
      entropy.push_back(std::abs(nd(rng)));
    }
  }
  ClippedPGInputs<double> inputs(const std::vector<double>& logprobs) const {
    return {logprobs, prev, adv, ref, gen, entropy};
  }
};

// Central differences of loss(logprobs) against the analytic gradient, every position (masked ones have 0).
// h = 1e-6: truncation error ~h²·|f'''| < 1e-10; rounding ~1e-16·Σ|terms|/h ~ 1e-9. Kinks (clip edges, clamps)
// are a set of measure zero that random inputs hit with probability ~1e-6 per token.
template <typename F>
void expect_matches_finite_differences(const std::vector<double>& x, F loss_and_grad) {
  std::vector<double> grad(x.size(), kNaN);
  loss_and_grad(x, grad);
  std::vector<double> scratch(x.size());
  const double h = 1e-6;
  for (size_t i = 0; i < x.size(); ++i) {
    auto xp = x, xm = x;
    xp[i] += h;
    xm[i] -= h;
    const double fd = (loss_and_grad(xp, scratch) - loss_and_grad(xm, scratch)) / (2 * h);
    EXPECT_NEAR(grad[i], fd, 1e-7) << "position " << i;
  }
}

TEST(Losses, GradientsMatchFiniteDifferences) {
  const uint64_t seed = testing::fresh_seed();
  std::mt19937_64 rng(seed);
  RandomBatch rb(4, 9, rng);
  const TokenMasks mv = rb.masks.view();
  const ValidCounts counts = count_valid(mv);

  expect_matches_finite_differences(rb.cur, [&](const std::vector<double>& x, std::vector<double>& g) {
    return nll_loss<double>(mv, x, counts, g).loss;
  });
  for (KLEstimator k : {KLEstimator::K1, KLEstimator::K2, KLEstimator::K3})
    for (Aggregation agg : {Aggregation::TokenMean, Aggregation::SequenceMean}) {
      ClippedPGConfig cfg{0.2, 0.28, 3.0, 0.3, k, agg};
      expect_matches_finite_differences(rb.cur, [&](const std::vector<double>& x, std::vector<double>& g) {
        return clipped_pg_loss<double>(mv, rb.inputs(x), cfg, counts, g).loss;
      });
    }
  for (auto& s : rb.masks.sample) s = 1;  // DPO pairs need agreeing sample masks
  const DPOCounts pairs = count_dpo_pairs(rb.masks.view());
  expect_matches_finite_differences(rb.cur, [&](const std::vector<double>& x, std::vector<double>& g) {
    return dpo_loss<double>(rb.masks.view(), x, rb.ref, {0.7, 0.2}, pairs, g).loss;
  });
}

// Two microbatches with the step's global counts give the loss and gradients of one call on the whole batch.
TEST(Losses, MicrobatchesSumToTheWholeBatch) {
  const uint64_t seed = testing::fresh_seed();
  std::mt19937_64 rng(seed);
  RandomBatch rb(6, 7, rng);
  rb.masks.sample = {1, 0, 1, 1, 1, 1};
  const int64_t seq = 7, n = 6 * seq;
  const ValidCounts global = count_valid(rb.masks.view());
  for (Aggregation agg : {Aggregation::TokenMean, Aggregation::SequenceMean}) {
    ClippedPGConfig cfg{0.2, 0.28, 3.0, 0.1, KLEstimator::K3, agg};
    auto whole_grad = poisoned(n);
    const LossResult whole = clipped_pg_loss<double>(rb.masks.view(), rb.inputs(rb.cur), cfg, global, whole_grad);
    double loss = 0, clipped = 0;
    std::vector<double> grad;
    for (int64_t first : {0, 4}) {
      const int64_t count = first == 0 ? 4 : 2;
      const Masks mb = rb.masks.rows(first, count);
      auto sub = [&](const std::vector<double>& v) { return rows_of(v, seq, first, count); };
      const auto cur = sub(rb.cur), prev = sub(rb.prev), adv = sub(rb.adv), ref = sub(rb.ref), gen = sub(rb.gen),
                 ent = sub(rb.entropy);
      auto g = poisoned(count * seq);
      const LossResult r = clipped_pg_loss<double>(mb.view(), {cur, prev, adv, ref, gen, ent}, cfg, global, g);
      loss += r.loss;
      clipped += r.metrics[0].sum;
      grad.insert(grad.end(), g.begin(), g.end());
    }
    EXPECT_NEAR(loss, whole.loss, 1e-14 * (1 + std::abs(whole.loss)));
    EXPECT_EQ(grad, whole_grad);  // each gradient depends on its own row only: identical arithmetic
    EXPECT_EQ(clipped, whole.metrics[0].sum);
  }
  // NLL and DPO (split on a pair boundary).
  rb.masks.sample = {1, 1, 0, 0, 1, 1};
  const DPOCounts pairs = count_dpo_pairs(rb.masks.view());
  auto whole_grad = poisoned(n), whole_dpo_grad = poisoned(n);
  const double whole_nll = nll_loss<double>(rb.masks.view(), rb.cur, global, whole_grad).loss;
  const double whole_dpo = dpo_loss<double>(rb.masks.view(), rb.cur, rb.ref, {0.3, 0.5}, pairs, whole_dpo_grad).loss;
  double nll = 0, dpo = 0;
  std::vector<double> nll_grad, dpo_grad;
  for (int64_t first : {0, 2}) {
    const int64_t count = first == 0 ? 2 : 4;
    const Masks mb = rb.masks.rows(first, count);
    const auto cur = rows_of(rb.cur, seq, first, count), ref = rows_of(rb.ref, seq, first, count);
    auto g = poisoned(count * seq), gd = poisoned(count * seq);
    nll += nll_loss<double>(mb.view(), cur, global, g).loss;
    dpo += dpo_loss<double>(mb.view(), cur, ref, {0.3, 0.5}, pairs, gd).loss;
    nll_grad.insert(nll_grad.end(), g.begin(), g.end());
    dpo_grad.insert(dpo_grad.end(), gd.begin(), gd.end());
  }
  EXPECT_NEAR(nll, whole_nll, 1e-14 * (1 + std::abs(whole_nll)));
  EXPECT_NEAR(dpo, whole_dpo, 1e-14 * (1 + std::abs(whole_dpo)));
  EXPECT_EQ(nll_grad, whole_grad);
  EXPECT_EQ(dpo_grad, whole_dpo_grad);
}

// The token-by-token gradient a policy applies inside its LM head is bit for bit the loss's own gradient, for NLL
// and every clipped-PG variant (aggregations, KL estimators, dual clip, importance weights, no reference), with
// sample masks off, fully masked rows and a NaN logprob.
TEST(Losses, TokenLocalGradientIsTheLossGradient) {
  std::mt19937_64 rng(testing::fresh_seed());
  RandomBatch rb(5, 8, rng);
  rb.masks.sample = {1, 0, 1, 1, 1};
  for (int64_t p = 0; p < 8; ++p) rb.masks.token[3 * 8 + p] = 0;  // row 3 counts nothing
  rb.cur[2 * 8 + 5] = kNaN;
  const TokenMasks mv = rb.masks.view();
  const ValidCounts counts = count_valid(mv);
  const auto expect_same = [&](const TokenLocalGradient& local, const std::vector<double>& grad, const char* what) {
    for (int64_t b = 0; b < 5; ++b)
      for (int64_t p = 0; p < 8; ++p) {
        const double want = grad[b * 8 + p], got = local(b, p, rb.cur[b * 8 + p]);
        if (std::isnan(want))
          EXPECT_TRUE(std::isnan(got)) << what << " token " << b << "," << p;
        else
          EXPECT_EQ(got, want) << what << " token " << b << "," << p;
      }
  };
  auto grad = poisoned(rb.cur.size());
  nll_loss<double>(mv, rb.cur, counts, grad);
  expect_same(TokenLocalGradient::nll(mv, counts), grad, "nll");
  for (KLEstimator k : {KLEstimator::K1, KLEstimator::K2, KLEstimator::K3})
    for (Aggregation agg : {Aggregation::TokenMean, Aggregation::SequenceMean})
      for (bool with_gen : {false, true}) {
        const ClippedPGConfig cfg{0.2, 0.28, with_gen ? 3.0 : 0.0, with_gen ? 0.3 : 0.0, k, agg};
        ClippedPGInputs<double> in = rb.inputs(rb.cur);
        if (!with_gen) in.gen_logprobs = {}, in.ref_logprobs = {};
        grad = poisoned(rb.cur.size());
        clipped_pg_loss<double>(mv, in, cfg, counts, grad);
        expect_same(TokenLocalGradient::clipped_pg<double>(mv, in, cfg, counts), grad, "clipped pg");
      }
  EXPECT_THROW(TokenLocalGradient::nll(mv, counts)(5, 0, 0.0), Error);
  ClippedPGInputs<double> short_adv = rb.inputs(rb.cur);
  short_adv.advantages = short_adv.advantages.subspan(1);
  EXPECT_THROW(TokenLocalGradient::clipped_pg<double>(mv, short_adv, {}, counts), Error);
}

// fp32 inputs go through the same double arithmetic: equal to the fp64 call on the same (fp32) values, up to the
// final rounding of each gradient to fp32.
TEST(Losses, Fp32MatchesFp64OnTheSameValues) {
  std::mt19937_64 rng(testing::fresh_seed());
  RandomBatch rb(3, 8, rng);
  auto to_f = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
  auto round = [&](const std::vector<double>& v) { auto f = to_f(v); return std::vector<double>(f.begin(), f.end()); };
  const auto cur = round(rb.cur), prev = round(rb.prev), adv = round(rb.adv);
  const auto fcur = to_f(cur), fprev = to_f(prev), fadv = to_f(adv);
  const ValidCounts counts = count_valid(rb.masks.view());
  std::vector<double> g64(cur.size(), kNaN);
  std::vector<float> g32(cur.size(), std::nanf(""));
  const double l64 = clipped_pg_loss<double>(rb.masks.view(), {cur, prev, adv}, {}, counts, g64).loss;
  const double l32 = clipped_pg_loss<float>(rb.masks.view(), {fcur, fprev, fadv}, {}, counts, g32).loss;
  EXPECT_EQ(l32, l64);
  for (size_t i = 0; i < g32.size(); ++i) EXPECT_EQ(g32[i], static_cast<float>(g64[i])) << i;
}

TEST(Losses, NaNAtACountedTokenGivesANaNLoss) {
  Masks m(2, 3);
  m.token = {1, 1, 0, 1, 1, 1};  // position 2 of row 0 does not count
  std::vector<double> lp = {0, -1, kNaN, 0, -1, -2}, z(6, 0.0), grad(6);
  // NaN only where nothing counts: ignored (padding may hold anything).
  EXPECT_FALSE(std::isnan(nll_loss<double>(m.view(), lp, {3, 2}, grad).loss));
  EXPECT_FALSE(std::isnan(clipped_pg_loss<double>(m.view(), {lp, lp, z}, {}, {3, 2}, grad).loss));
  lp[4] = kNaN;
  EXPECT_TRUE(std::isnan(nll_loss<double>(m.view(), lp, {3, 2}, grad).loss));
  EXPECT_TRUE(std::isnan(clipped_pg_loss<double>(m.view(), {lp, z, z}, {}, {3, 2}, grad).loss));
  EXPECT_TRUE(std::isnan(grad[4]));
  // NaN advantages at a counted token, and a NaN prev where A = 0 (no silent 0·NaN = 0).
  std::vector<double> adv(6, 0.0);
  adv[5] = kNaN;
  EXPECT_TRUE(std::isnan(clipped_pg_loss<double>(m.view(), {z, z, adv}, {}, {3, 2}, grad).loss));
  std::vector<double> prev(6, 0.0);
  prev[1] = kNaN;
  EXPECT_TRUE(std::isnan(clipped_pg_loss<double>(m.view(), {z, prev, z}, {}, {3, 2}, grad).loss));
  EXPECT_TRUE(std::isnan(dpo_loss<double>(m.view(), lp, z, {}, {1, 1}, grad).loss));
}

TEST(Losses, BadInputsAreErrors) {
  Masks m(2, 3);
  std::vector<double> v(6, 0.0), grad(6), short_v(5, 0.0);
  EXPECT_THROW(nll_loss<double>(m.view(), short_v, {4, 2}, grad), Error);
  EXPECT_THROW(nll_loss<double>(m.view(), v, {3, 2}, grad), Error);  // 4 tokens count here, global says 3
  ClippedPGConfig dual;
  dual.dual_clip = 0.5;
  EXPECT_THROW(clipped_pg_loss<double>(m.view(), {v, v, v}, dual, {4, 2}, grad), Error);
  ClippedPGConfig kl;
  kl.kl_beta = 0.1;
  EXPECT_THROW(clipped_pg_loss<double>(m.view(), {v, v, v}, kl, {4, 2}, grad), Error);  // no ref_logprobs
  m.sample = {1, 0};
  EXPECT_THROW(count_dpo_pairs(m.view()), Error);  // a pair with disagreeing sample masks
  Masks odd(3, 3);
  EXPECT_THROW(count_dpo_pairs(odd.view()), Error);
}

}  // namespace
}  // namespace ringtrain::train
