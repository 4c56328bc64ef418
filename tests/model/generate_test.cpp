// The KV-cache sampler (model/generate.h) against independent references: Policy::score of the whole growing
// sequence (no cache, the math attention backend where the sampler's decode steps run on flash), each prompt
// generated alone (for the batch), and hand-computed processed distributions for temperature / top-k / top-p.
//
// Tolerances: the sampler and the scorer compute the same fp32 model with different attention backends, a cache
// versus a whole-sequence pass and different GEMM row blocking, so their logprobs differ by fp32 summation order;
// on these models (|logprob| < 20, hidden 16-64) that is a few ulps of the logprob, well inside 1e-5.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <random>
#include <string>

#include "model_test_util.h"
#include "ringtrain/attention/selection.h"
#include "ringtrain/core/error.h"
#include "ringtrain/model/generate.h"
#include "ringtrain/model/policy.h"
#include "test_util.h"

namespace ringtrain {
namespace {

using attention::BackendId;
using model::Arch;
using model::Generation;
using model::Policy;
using model::PolicyOptions;
using model::Sampler;
using model::SamplingParams;
using model::TokenBatch;

constexpr double kLogprobTol = 1e-5;

PolicyOptions math_policy(DType dtype = DType::F32) {
  PolicyOptions o;
  o.dtype = dtype;
  o.model.attention_backends = {BackendId::Math};
  return o;
}

std::unique_ptr<Policy> fixture_policy(Arch arch) {
  return model::load_policy(testing::model_fixture_dir(model::arch_model_type(arch)) / "checkpoint", math_policy());
}

std::unique_ptr<Policy> tiny_policy(Arch arch, std::mt19937_64& rng, DType dtype = DType::F32) {
  const model::ModelConfig c = testing::tiny_config(arch);
  return model::make_policy(c, testing::tiny_params(c, rng), math_policy(dtype));
}

std::vector<std::vector<int32_t>> random_prompts(const std::vector<int64_t>& lengths, int64_t vocab,
                                                 std::mt19937_64& rng) {
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t n : lengths) prompts.push_back(testing::random_ids(n, vocab, rng));
  return prompts;
}

// Policy::score of every next token v after `prefix`: the policy's whole distribution there, one sequence per v.
std::vector<float> next_token_logprobs(Policy& policy, const std::vector<int32_t>& prefix) {
  const int64_t vocab = policy.config().vocab;
  TokenBatch batch;
  for (int32_t v = 0; v < vocab; ++v) {
    batch.sequences.push_back(prefix);
    batch.sequences.back().push_back(v);
  }
  const model::TokenScores s = policy.score(batch, false);
  std::vector<float> lp(static_cast<size_t>(vocab));
  for (int32_t v = 0; v < vocab; ++v) lp[v] = s.logprobs[v].back();
  return lp;
}

// log q(token) of the processed distribution, in fp64 from the policy's logprobs: softmax(lp / T) over the top_k
// most likely and those tied with the k-th, then over the shortest most-likely prefix reaching top_p of that mass and
// those tied with its last; -inf outside it.
double processed_logprob(const std::vector<float>& lp, const SamplingParams& s, int32_t token) {
  std::vector<int32_t> order(lp.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return lp[a] > lp[b]; });
  if (s.top_k > 0 && s.top_k < static_cast<int64_t>(order.size())) {
    size_t k = static_cast<size_t>(s.top_k);
    while (k < order.size() && lp[order[k]] == lp[order[k - 1]]) ++k;
    order.resize(k);
  }
  std::vector<double> w;
  for (int32_t v : order) w.push_back(std::exp((static_cast<double>(lp[v]) - lp[order[0]]) / s.temperature));
  const double total = std::accumulate(w.begin(), w.end(), 0.0);
  double mass = 0;
  size_t kept = 0;
  while (kept < w.size() && mass < s.top_p * total) mass += w[kept++];
  while (kept < w.size() && lp[order[kept]] == lp[order[kept - 1]]) mass += w[kept++];
  for (size_t i = 0; i < kept; ++i)
    if (order[i] == token) return std::log(w[i] / mass);
  return -std::numeric_limits<double>::infinity();
}

// The sampled tokens' logprobs re-scored by the policy over prompt + tokens.
void expect_scored(Policy& policy, const std::vector<std::vector<int32_t>>& prompts,
                   const std::vector<Generation>& gens) {
  ASSERT_EQ(gens.size(), prompts.size());
  TokenBatch batch;
  for (size_t b = 0; b < prompts.size(); ++b) {
    batch.sequences.push_back(prompts[b]);
    batch.sequences.back().insert(batch.sequences.back().end(), gens[b].tokens.begin(), gens[b].tokens.end());
  }
  const model::TokenScores s = policy.score(batch, false);
  for (size_t b = 0; b < prompts.size(); ++b) {
    ASSERT_EQ(gens[b].logprobs.size(), gens[b].tokens.size());
    for (size_t i = 0; i < gens[b].tokens.size(); ++i) {
      const float want = s.logprobs[b][prompts[b].size() + i];
      ASSERT_LE(std::fabs(gens[b].logprobs[i] - want), kLogprobTol) << "prompt " << b << " token " << i;
    }
  }
}

void expect_same(const std::vector<Generation>& a, const std::vector<Generation>& b, double tol,
                 const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].tokens, b[i].tokens) << what << " sequence " << i;
    ASSERT_EQ(a[i].finish, b[i].finish) << what << " sequence " << i;
    for (size_t t = 0; t < a[i].tokens.size(); ++t) {
      ASSERT_LE(std::fabs(a[i].logprobs[t] - b[i].logprobs[t]), tol) << what << " sequence " << i << " token " << t;
      ASSERT_LE(std::fabs(a[i].sampling_logprobs[t] - b[i].sampling_logprobs[t]), tol) << what << " sequence " << i;
    }
  }
}

class GenerateArch : public ::testing::TestWithParam<Arch> {};

// Greedy decoding picks, at every step, the argmax of the policy's distribution over the growing sequence.
TEST_P(GenerateArch, GreedyIsArgmaxOfScore) {
  std::mt19937_64 rng(testing::fresh_seed());
  std::unique_ptr<Policy> policy = fixture_policy(GetParam());
  const auto prompts = random_prompts({3, 8}, policy->config().vocab, rng);
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = 6;
  Sampler sampler(*policy);
  const std::vector<Generation> gens = sampler.generate(prompts, greedy);
  for (size_t b = 0; b < prompts.size(); ++b) {
    ASSERT_EQ(gens[b].tokens.size(), 6u);
    EXPECT_EQ(gens[b].finish, model::FinishReason::Length);
    std::vector<int32_t> prefix = prompts[b];
    for (size_t i = 0; i < gens[b].tokens.size(); ++i) {
      const std::vector<float> lp = next_token_logprobs(*policy, prefix);
      const int32_t token = gens[b].tokens[i];
      const float best = *std::max_element(lp.begin(), lp.end());
      // The argmax, unless another token is within the fp32 difference of the two computations (a tie).
      ASSERT_GE(lp[token], best - kLogprobTol) << "prompt " << b << " step " << i;
      ASSERT_LE(std::fabs(gens[b].logprobs[i] - lp[token]), kLogprobTol) << "prompt " << b << " step " << i;
      EXPECT_EQ(gens[b].sampling_logprobs[i], 0.f);
      prefix.push_back(token);
    }
  }
}

// Sampled tokens' logprobs are the unmodified policy's: what Policy::score gives for the same sequences.
TEST_P(GenerateArch, LogprobsEqualScore) {
  std::mt19937_64 rng(testing::fresh_seed());
  std::unique_ptr<Policy> policy = fixture_policy(GetParam());
  const auto prompts = random_prompts({1, 5, 12, 4}, policy->config().vocab, rng);
  SamplingParams s;
  s.temperature = 0.7, s.top_k = 40, s.top_p = 0.9, s.max_new_tokens = 9, s.seed = rng();
  Sampler sampler(*policy);
  const std::vector<Generation> gens = sampler.generate(prompts, s);
  expect_scored(*policy, prompts, gens);
  // The processed distribution's logprobs, for the first steps, from the policy's whole distribution there.
  for (size_t b = 0; b < prompts.size(); ++b) {
    std::vector<int32_t> prefix = prompts[b];
    for (size_t i = 0; i < 3 && i < gens[b].tokens.size(); ++i) {
      const double want = processed_logprob(next_token_logprobs(*policy, prefix), s, gens[b].tokens[i]);
      // fp32 logprobs 1e-6 apart, divided by the temperature, in a probability renormalised over the kept set.
      ASSERT_NEAR(gens[b].sampling_logprobs[i], want, 1e-4) << "prompt " << b << " token " << i;
      prefix.push_back(gens[b].tokens[i]);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Arch, GenerateArch, ::testing::Values(Arch::Llama, Arch::Qwen2, Arch::Qwen3, Arch::Mistral),
                         [](const auto& info) { return model::arch_model_type(info.param); });

// A batch of different prompt lengths gives each prompt what it gets alone (with the same sample id), in any order.
TEST(Generate, BatchEqualsOneAtATime) {
  std::mt19937_64 rng(testing::fresh_seed());
  std::unique_ptr<Policy> policy = tiny_policy(Arch::Qwen2, rng);
  const auto prompts = random_prompts({7, 1, 4, 9, 2}, policy->config().vocab, rng);
  SamplingParams s;
  s.max_new_tokens = 10, s.seed = rng(), s.stop_tokens = {3, 17};
  Sampler sampler(*policy);
  const std::vector<Generation> batch = sampler.generate(prompts, s);
  expect_scored(*policy, prompts, batch);
  for (size_t b = 0; b < prompts.size(); ++b) {
    const uint64_t id = b;
    const std::vector<Generation> alone = sampler.generate({prompts[b]}, s, {&id, 1});
    expect_same(alone, {batch[b]}, kLogprobTol, "alone vs batch");
  }
  std::vector<std::vector<int32_t>> reversed(prompts.rbegin(), prompts.rend());
  std::vector<uint64_t> ids(prompts.size());
  for (size_t b = 0; b < ids.size(); ++b) ids[b] = ids.size() - 1 - b;
  std::vector<Generation> back = sampler.generate(reversed, s, ids);
  std::reverse(back.begin(), back.end());
  expect_same(back, batch, kLogprobTol, "reversed batch");
}

TEST(Generate, SeedDeterminesSamples) {
  std::mt19937_64 rng(testing::fresh_seed());
  std::unique_ptr<Policy> policy = tiny_policy(Arch::Llama, rng);
  const auto prompts = random_prompts({3, 3, 6, 2, 5, 4}, policy->config().vocab, rng);
  SamplingParams s;
  s.max_new_tokens = 8, s.seed = rng();
  Sampler sampler(*policy);
  const std::vector<Generation> a = sampler.generate(prompts, s);
  expect_same(sampler.generate(prompts, s), a, 0.0, "same seed");
  s.seed += 1;
  const std::vector<Generation> b = sampler.generate(prompts, s);
  // 48 draws from distributions of 32 tokens: all equal by chance has negligible probability.
  bool differs = false;
  for (size_t i = 0; i < a.size(); ++i) differs |= a[i].tokens != b[i].tokens;
  EXPECT_TRUE(differs);
  // The same prompt with distinct sample ids: distinct samples (GRPO's group).
  const std::vector<std::vector<int32_t>> group(4, prompts[0]);
  const std::vector<Generation> g = sampler.generate(group, s);
  bool group_differs = false;
  for (size_t i = 1; i < g.size(); ++i) group_differs |= g[i].tokens != g[0].tokens;
  EXPECT_TRUE(group_differs);
}

TEST(Generate, StopTokenEndsItsSequence) {
  std::mt19937_64 rng(testing::fresh_seed());
  std::unique_ptr<Policy> policy = tiny_policy(Arch::Qwen3, rng);
  const auto prompts = random_prompts({4, 6, 2}, policy->config().vocab, rng);
  SamplingParams s;
  s.max_new_tokens = 12, s.seed = rng();
  Sampler sampler(*policy);
  const std::vector<Generation> free_run = sampler.generate(prompts, s);
  // Stop on prompt 0's third token: prompt 0 ends at its first occurrence, the others at theirs (or run on).
  const int32_t stop = free_run[0].tokens[2];
  s.stop_tokens = {stop};
  const std::vector<Generation> stopped = sampler.generate(prompts, s);
  for (size_t b = 0; b < prompts.size(); ++b) {
    const auto& full = free_run[b].tokens;
    const auto first = std::find(full.begin(), full.end(), stop);
    const size_t want_len = first == full.end() ? full.size() : static_cast<size_t>(first - full.begin()) + 1;
    ASSERT_EQ(stopped[b].tokens, std::vector<int32_t>(full.begin(), full.begin() + want_len)) << "prompt " << b;
    EXPECT_EQ(stopped[b].finish, first == full.end() ? model::FinishReason::Length : model::FinishReason::Stop);
    ASSERT_EQ(stopped[b].logprobs.size(), want_len);
  }
  EXPECT_LE(stopped[0].tokens.size(), 3u);
  EXPECT_EQ(stopped[0].tokens.back(), stop);
}

TEST(Generate, TopKOneIsGreedy) {
  std::mt19937_64 rng(testing::fresh_seed());
  std::unique_ptr<Policy> policy = tiny_policy(Arch::Mistral, rng);
  const auto prompts = random_prompts({5, 3}, policy->config().vocab, rng);
  SamplingParams greedy;
  greedy.temperature = 0, greedy.max_new_tokens = 7;
  SamplingParams top1 = greedy;
  top1.temperature = 1.5, top1.top_k = 1, top1.seed = rng();
  Sampler sampler(*policy);
  expect_same(sampler.generate(prompts, top1), sampler.generate(prompts, greedy), 0.0, "top-k 1 vs greedy");
}

// The decode steps (Sq = 1 against the cache, bottom-right causal) go through the selection: flash on the CPU by
// default, math when the sampler's allow-list says so, with the same samples.
TEST(Generate, AttentionBackendThroughSelection) {
  std::mt19937_64 rng(testing::fresh_seed());
  std::unique_ptr<Policy> policy = tiny_policy(Arch::Llama, rng);
  const auto prompts = random_prompts({3, 5}, policy->config().vocab, rng);
  SamplingParams s;
  s.max_new_tokens = 4, s.seed = rng();
  Sampler flash(*policy);
  attention::reset_dispatch_counts();
  const std::vector<Generation> a = flash.generate(prompts, s);
  const attention::DispatchCounts counts = attention::dispatch_counts();
  // Per layer: one prefill call per prompt, then one call per sequence per decode step (3 steps after the first).
  const int64_t layers = policy->config().layers;
  attention::AttnParams decode;
  decode.heads_q = policy->config().heads, decode.heads_kv = policy->config().kv_heads;
  decode.head_dim = policy->config().head_dim, decode.seqlen_q = 1, decode.seqlen_kv = 6;
  decode.mask = attention::MaskType::CausalBottomRight;
  const attention::Selection chosen = attention::explain(decode);
  ASSERT_NE(chosen.backend, nullptr) << chosen.report();
  if (!std::getenv("RINGTRAIN_SDPA_BACKENDS")) {
    EXPECT_EQ(chosen.backend->id(), BackendId::Flash) << chosen.report();
  }
  EXPECT_EQ(counts.forward[static_cast<int>(chosen.backend->id())], layers * (2 + 2 * 3));
  EXPECT_EQ(counts.total(), layers * (2 + 2 * 3));

  if (std::getenv("RINGTRAIN_SDPA_BACKENDS")) return;  // a root list without math leaves nothing to narrow to
  model::SamplerOptions math_only;
  math_only.attention_backends = {BackendId::Math};
  Sampler math(*policy, math_only);
  attention::reset_dispatch_counts();
  expect_same(math.generate(prompts, s), a, kLogprobTol, "math vs flash");
  EXPECT_EQ(attention::dispatch_counts().forward[static_cast<int>(BackendId::Math)], layers * (2 + 2 * 3));
}

// The sampler reads the weights where they are: new weights are used by the next generate() without a copy.
TEST(Generate, ReadsWeightsInPlace) {
  std::mt19937_64 rng(testing::fresh_seed());
  const model::ModelConfig c = testing::tiny_config(Arch::Llama);
  std::vector<float> w0 = testing::tiny_params(c, rng), w1 = testing::tiny_params(c, rng);
  const auto prompts = random_prompts({4, 2}, c.vocab, rng);
  SamplingParams s;
  s.max_new_tokens = 6, s.seed = rng();

  std::unique_ptr<Policy> policy = model::make_policy(c, w0, math_policy());
  Sampler from_policy(*policy);
  const std::vector<Generation> before = from_policy.generate(prompts, s);
  policy->set_params(w1);
  const std::vector<Generation> after = from_policy.generate(prompts, s);
  expect_scored(*policy, prompts, after);
  expect_same(after, Sampler(c, w1.data()).generate(prompts, s), 0.0, "policy after set_params vs fresh sampler");

  std::vector<float> buffer = w0;
  Sampler from_buffer(c, buffer.data());
  expect_same(from_buffer.generate(prompts, s), before, 0.0, "buffer w0");
  std::copy(w1.begin(), w1.end(), buffer.begin());
  expect_same(from_buffer.generate(prompts, s), after, 0.0, "buffer w1");

  // A policy whose weights are not host fp32 (here fp64) is read through params() at each call.
  std::unique_ptr<Policy> f64 = model::make_policy(c, w1, math_policy(DType::F64));
  expect_same(Sampler(*f64).generate(prompts, s), after, 0.0, "fp64 policy's host copy");
}

// Temperature, top-k and top-p against hand-computed processed distributions, by frequency (seeded draws).
TEST(ChooseToken, FrequenciesMatchProcessedDistribution) {
  // Probabilities 0.4, 0.25, 0.15, 0.1, 0.06, 0.04 in shuffled token order.
  const std::vector<double> p = {0.1, 0.4, 0.04, 0.15, 0.25, 0.06};
  std::vector<float> lp;
  for (double x : p) lp.push_back(static_cast<float>(std::log(x)));
  struct Case {
    SamplingParams s;
    std::vector<double> q;  // expected processed distribution by token
  };
  std::vector<Case> cases;
  {
    Case c;  // top-p 0.75: 0.4 + 0.25 = 0.65 < 0.75, + 0.15 crosses it: tokens 1, 4, 3, renormalised by 0.8
    c.s.top_p = 0.75;
    c.q = {0, 0.5, 0, 0.1875, 0.3125, 0};
    cases.push_back(c);
  }
  {
    Case c;  // temperature 2, top-k 3: q ∝ p^(1/2) over the three most likely
    c.s.temperature = 2, c.s.top_k = 3;
    const double z = std::sqrt(0.4) + std::sqrt(0.25) + std::sqrt(0.15);
    c.q = {0, std::sqrt(0.4) / z, 0, std::sqrt(0.15) / z, std::sqrt(0.25) / z, 0};
    cases.push_back(c);
  }
  {
    Case c;  // no processing
    c.q = p;
    cases.push_back(c);
  }
  {
    Case c;  // temperature 0.5 then top-p 0.95: q ∝ p² = .16, .0625, .0225, .01, .0036, .0016 (sum .2602); the
    c.s.temperature = 0.5, c.s.top_p = 0.95;  // prefix masses .615, .855, .942, .980: four tokens, mass .255
    const double z = 0.16 + 0.0625 + 0.0225 + 0.01;
    c.q = {0.01 / z, 0.16 / z, 0, 0.0225 / z, 0.0625 / z, 0};
    cases.push_back(c);
  }
  const uint64_t seed = testing::fresh_seed();
  constexpr int64_t kDraws = 40000;
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Case& c = cases[ci];
    std::vector<int64_t> count(p.size(), 0);
    for (int64_t i = 0; i < kDraws; ++i) {
      const model::TokenChoice t = model::choose_token(lp, c.s, model::sampling_uniform(seed, ci, i));
      ASSERT_GT(c.q[t.token], 0) << "case " << ci << ": token " << t.token << " is outside the kept set";
      ASSERT_NEAR(t.logprob, lp[t.token], 0.0);
      ASSERT_NEAR(t.sampling_logprob, std::log(c.q[t.token]), 1e-6) << "case " << ci;
      ++count[t.token];
    }
    // Pearson chi-square over the kept tokens (at most 5 degrees of freedom): 30 is exceeded with probability
    // below 2e-5 by a correct sampler, while a wrong truncation or temperature shifts counts by hundreds.
    double chi2 = 0;
    for (size_t v = 0; v < p.size(); ++v) {
      if (c.q[v] == 0) continue;
      const double expect = c.q[v] * kDraws;
      chi2 += (count[v] - expect) * (count[v] - expect) / expect;
    }
    EXPECT_LT(chi2, 30.0) << "case " << ci;
  }
}

// Exact ties at the top-k and top-p boundaries keep every tied token (Hugging Face's top-k masks only what is below
// the k-th; the GPU sampler keeps both ties), each drawn as often as its probability says.
TEST(ChooseToken, TiesAtTheCutOffsAreKept) {
  // Probabilities 0.3, then 0.2 three times (tokens 0, 2, 4), then 0.05 twice.
  const std::vector<double> p = {0.2, 0.3, 0.2, 0.05, 0.2, 0.05};
  std::vector<float> lp;
  for (double x : p) lp.push_back(static_cast<float>(std::log(x)));
  SamplingParams top2, nucleus;
  top2.top_k = 2;        // the k-th is one of the three 0.2s: all three stay, mass 0.9
  nucleus.top_p = 0.45;  // 0.3 + 0.2 crosses 0.45 at a 0.2: its two ties stay too
  const std::vector<double> want = {0.2 / 0.9, 0.3 / 0.9, 0.2 / 0.9, 0, 0.2 / 0.9, 0};
  const uint64_t seed = testing::fresh_seed();
  for (const SamplingParams& s : {top2, nucleus}) {
    std::vector<int64_t> count(p.size(), 0);
    constexpr int64_t kDraws = 30000;
    for (int64_t i = 0; i < kDraws; ++i) {
      const model::TokenChoice t = model::choose_token(lp, s, model::sampling_uniform(seed, s.top_k, i));
      ASSERT_GT(want[t.token], 0) << "token " << t.token << " is outside the kept set (top_k " << s.top_k << ")";
      ASSERT_NEAR(t.sampling_logprob, std::log(want[t.token]), 1e-6);
      ASSERT_NEAR(t.sampling_logprob, processed_logprob(lp, s, t.token), 1e-6);
      ++count[t.token];
    }
    // Chi-square over the 4 kept tokens (3 degrees of freedom): 25 is exceeded with probability below 2e-5; a
    // dropped tie moves its count by thousands.
    double chi2 = 0;
    for (size_t v = 0; v < p.size(); ++v)
      if (want[v] > 0) chi2 += std::pow(count[v] - want[v] * kDraws, 2) / (want[v] * kDraws);
    EXPECT_LT(chi2, 25.0) << "top_k " << s.top_k << ", top_p " << s.top_p;
  }
  // top_k = 1 is greedy, as on the GPU: the lowest id of a tied top, whatever the draw.
  SamplingParams top1;
  top1.top_k = 1;
  const std::vector<float> tied_top = {-3.f, -0.9f, -2.f, -0.9f};
  for (double u : {0.0, 0.5, 0.999}) EXPECT_EQ(model::choose_token(tied_top, top1, u).token, 1);
}

TEST(ChooseToken, GreedyAndBadInputs) {
  const std::vector<float> lp = {-2.f, -0.5f, -0.5f, -3.f};
  SamplingParams greedy;
  greedy.temperature = 0;
  const model::TokenChoice t = model::choose_token(lp, greedy, 0.99);
  EXPECT_EQ(t.token, 1);  // a tie goes to the lower id
  EXPECT_EQ(t.logprob, -0.5f);
  std::vector<float> nan = lp;
  nan[2] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(model::choose_token(nan, SamplingParams{}, 0.5), Error);
  EXPECT_THROW(model::choose_token(lp, SamplingParams{}, 1.0), Error);
}

TEST(Generate, BadRequestsNameTheProblem) {
  std::mt19937_64 rng(testing::fresh_seed());
  const model::ModelConfig c = testing::tiny_config(Arch::Llama);
  std::vector<float> w = testing::tiny_params(c, rng);
  Sampler sampler(c, w.data());
  const auto expect_error = [&](const std::vector<std::vector<int32_t>>& prompts, const SamplingParams& s,
                                const std::string& needle) {
    try {
      sampler.generate(prompts, s);
      FAIL() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  SamplingParams s;
  expect_error({}, s, "no prompts");
  expect_error({{1, 2}, {}}, s, "prompt 1 is empty");
  expect_error({{1, 32}}, s, "prompt 0 token 1 = 32");
  SamplingParams bad = s;
  bad.top_p = 0;
  expect_error({{1}}, bad, "top_p");
  bad = s, bad.temperature = -1;
  expect_error({{1}}, bad, "temperature");
  bad = s, bad.stop_tokens = {-1};
  expect_error({{1}}, bad, "stop token -1");
  bad = s, bad.max_new_tokens = 0;
  expect_error({{1}}, bad, "max_new_tokens");

  model::SamplerOptions small;
  small.max_cache_bytes = 1000;
  Sampler bounded(c, w.data(), small);
  try {
    bounded.generate({{1, 2, 3}}, s);
    ADD_FAILURE() << "no error for a cache over max_cache_bytes";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_cache_bytes"), std::string::npos) << e.what();
  }
  bad = s, bad.max_new_tokens = std::numeric_limits<int64_t>::max();
  expect_error({{1}}, bad, "max_new_tokens");
  bad = s, bad.max_new_tokens = std::numeric_limits<int32_t>::max() - 1;
  expect_error({{1, 2, 3}}, bad, "does not fit int32 positions");
  expect_error({{1}}, bad, "longer than config key 'max_position_embeddings'");

  w[static_cast<size_t>(model::ParamLayout(c).final_norm)] = std::numeric_limits<float>::quiet_NaN();
  expect_error({{1, 2}}, s, "prompt 0, new token 0");
}

}  // namespace
}  // namespace ringtrain
