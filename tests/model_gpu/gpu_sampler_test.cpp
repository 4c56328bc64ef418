// The GPU sampler (model/cuda/gpu_sampler.h), reached through Sampler(policy) on a GPU policy: decoding in bf16 on
// the GPU with the policy's weights in place, attention over the KV cache through the selection (the decode backend),
// sampling on the GPU. Against:
//  - the GPU policy's own score of the sampled sequences (the same bf16 weights and kernels, but one whole-sequence
//    forward instead of prefill + cached steps, so every layer's bf16 outputs may round differently): each token
//    within 4e-2 absolute plus four bf16 ulps of its magnitude (the largest difference seen over many seeds was
//    0.053 at a logprob of -3.9), and their mean within 2e-2 (means seen: 0.005 to 0.010; a cache or position
//    error moves most tokens by far more), for the four architectures, and after set_params (the next generate() must
//    use the new weights); with sliding windows shorter than the sequences (decode's windowed calls, and the
//    per-sequence calls of an allow-list without decode);
//  - the CPU fp32 policy on the same (bf16-rounded) weights for greedy decoding: each greedy token must be the CPU's
//    argmax or within the tolerance of it (a near-tie that bf16 arithmetic may break the other way);
//  - itself: the same seed gives bit-identical samples, and a sequence keeps its samples when its companions and its
//    place in the batch change (same shapes); top-k = 1 is greedy; stop tokens end sequences; a cache over
//    max_cache_bytes is an error before anything runs;
//  - the sampling kernel alone against the processed distribution computed here in fp64 (temperature, top-k, top-p):
//    every draw inside the kept set, its logprobs to fp32 accuracy, and the frequencies of the likeliest tokens over
//    65,536 draws within 5 standard deviations.
// Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "kernel_test_util.h"
#include "model/model_test_util.h"
#include "ringtrain/attention/selection.h"
#include "ringtrain/core/error.h"
#include "ringtrain/model/generate.h"
#include "ringtrain/model/params.h"
#include "ringtrain/model/policy.h"
#include "test_util.h"
#ifdef RINGTRAIN_WITH_CUDA
#include "ringtrain/model/cuda/sample_kernels.h"
#endif

namespace ringtrain {
namespace {

using model::Arch;
using model::Generation;

constexpr double kLogprobTol = 4e-2;
constexpr double kLogprobRelTol = 1.0 / 64;
constexpr double kLogprobMeanTol = 2e-2;

model::ModelConfig sampler_config(Arch arch) {
  model::ModelConfig c = testing::tiny_config(arch, /*tied=*/arch == Arch::Qwen3);
  c.hidden = 256, c.heads = 4, c.kv_heads = 2, c.head_dim = 64, c.ffn = 512, c.vocab = 1000;
  return c;
}

// Transformers' initialisation scaled up 2x, as the GPU policy test: attention far from uniform, logits small enough
// that bf16 noise is not amplified.
std::unique_ptr<model::Policy> gpu_policy(const model::ModelConfig& c, uint64_t seed) {
  std::vector<float> p = model::random_params(model::ParamLayout(c), seed);
  for (float& x : p) x *= 2;
  model::PolicyOptions o;
  o.device = Device::cuda(0);
  o.dtype = DType::BF16;
  return model::make_policy(c, p, o);
}

std::vector<std::vector<int32_t>> prompts_of(std::initializer_list<int64_t> lens, int64_t vocab, std::mt19937_64& rng) {
  std::vector<std::vector<int32_t>> out;
  for (int64_t n : lens) out.push_back(testing::random_ids(n, vocab, rng));
  return out;
}

model::TokenBatch continued(const std::vector<std::vector<int32_t>>& prompts, const std::vector<Generation>& gens) {
  model::TokenBatch batch;
  for (size_t b = 0; b < prompts.size(); ++b) {
    batch.sequences.push_back(prompts[b]);
    batch.sequences.back().insert(batch.sequences.back().end(), gens[b].tokens.begin(), gens[b].tokens.end());
  }
  return batch;
}

void expect_logprobs_match_score(model::Policy& policy, const std::vector<std::vector<int32_t>>& prompts,
                                 const std::vector<Generation>& gens) {
  const model::TokenScores scores = policy.score(continued(prompts, gens), false);
  double worst = 0, sum = 0;
  int64_t count = 0;
  for (size_t b = 0; b < prompts.size(); ++b)
    for (size_t i = 0; i < gens[b].tokens.size(); ++i) {
      const double got = gens[b].logprobs[i], want = scores.logprobs[b][prompts[b].size() + i];
      ASSERT_FALSE(std::isnan(got));
      ASSERT_LE(std::fabs(got - want), kLogprobTol + kLogprobRelTol * std::fabs(want))
          << "prompt " << b << " token " << i << ": " << got << " vs " << want;
      worst = std::max(worst, std::fabs(got - want));
      sum += std::fabs(got - want), ++count;
    }
  ASSERT_GT(count, 0);
  EXPECT_LE(sum / static_cast<double>(count), kLogprobMeanTol) << "mean |sampler logprob - score|";
  std::printf("max |sampler logprob - score| = %.3g, mean %.3g\n", worst, sum / static_cast<double>(count));
}

void expect_identical(const Generation& a, const Generation& b, const std::string& what) {
  EXPECT_EQ(a.tokens, b.tokens) << what;
  EXPECT_EQ(a.logprobs, b.logprobs) << what;
  EXPECT_EQ(a.sampling_logprobs, b.sampling_logprobs) << what;
  EXPECT_EQ(a.finish, b.finish) << what;
}

class GpuSamplerArch : public ::testing::TestWithParam<Arch> {};

TEST_P(GpuSamplerArch, LogprobsMatchScoreAndTheNextCallSeesNewWeights) {
  RT_REQUIRE_GPU();
  std::mt19937_64 rng(testing::fresh_seed());
  const model::ModelConfig c = sampler_config(GetParam());
  std::unique_ptr<model::Policy> gpu = gpu_policy(c, rng());
  const auto prompts = prompts_of({5, 12, 3, 40, 1}, c.vocab, rng);
  model::SamplingParams s;
  s.max_new_tokens = 12, s.seed = rng();

  model::Sampler sampler(*gpu);
  attention::reset_dispatch_counts();
  const std::vector<Generation> gens = sampler.generate(prompts, s);
  const attention::DispatchCounts counts = attention::dispatch_counts();
  EXPECT_EQ(counts.forward[static_cast<int>(attention::BackendId::Decode)], c.layers * (s.max_new_tokens - 1))
      << attention::format_dispatch_counts(counts);
  for (const Generation& g : gens) {
    ASSERT_EQ(static_cast<int64_t>(g.tokens.size()), s.max_new_tokens);
    EXPECT_EQ(g.finish, model::FinishReason::Length);
    for (size_t i = 0; i < g.tokens.size(); ++i) {
      EXPECT_TRUE(g.tokens[i] >= 0 && g.tokens[i] < c.vocab);
      // Temperature 1, no top-k/top-p: the sampled distribution is the policy's.
      EXPECT_NEAR(g.sampling_logprobs[i], g.logprobs[i], 1e-4);
    }
  }
  expect_logprobs_match_score(*gpu, prompts, gens);

  gpu->set_params(model::random_params(model::ParamLayout(c), rng()));
  const std::vector<Generation> after = sampler.generate(prompts, s);
  bool changed = false;
  for (size_t b = 0; b < prompts.size(); ++b) changed |= after[b].logprobs != gens[b].logprobs;
  EXPECT_TRUE(changed) << "the new weights were not used";
  expect_logprobs_match_score(*gpu, prompts, after);
}

INSTANTIATE_TEST_SUITE_P(Archs, GpuSamplerArch, ::testing::Values(Arch::Llama, Arch::Qwen2, Arch::Qwen3, Arch::Mistral),
                         [](const auto& info) { return model::arch_model_type(info.param); });

// An allow-list without decode: the sampler attends per sequence with ordinary calls, to the same results (within
// the tolerance), and says nothing to the decode backend.
TEST(GpuSampler, WithoutDecodeInTheAllowListAttendsPerSequence) {
  RT_REQUIRE_GPU();
  std::mt19937_64 rng(testing::fresh_seed());
  const model::ModelConfig c = sampler_config(Arch::Llama);
  std::unique_ptr<model::Policy> gpu = gpu_policy(c, rng());
  const auto prompts = prompts_of({9, 4, 30}, c.vocab, rng);
  model::SamplerOptions o;
  o.attention_backends = {attention::BackendId::Flash, attention::BackendId::Efficient, attention::BackendId::Math};
  model::SamplingParams s;
  s.max_new_tokens = 6, s.seed = rng();
  attention::reset_dispatch_counts();
  const std::vector<Generation> gens = model::Sampler(*gpu, o).generate(prompts, s);
  EXPECT_EQ(attention::dispatch_counts().forward[static_cast<int>(attention::BackendId::Decode)], 0);
  expect_logprobs_match_score(*gpu, prompts, gens);
}

// Sliding windows shorter than the sequences (Mistral: both layers; Qwen2: the second, the first attending fully),
// generating well past the window: the decode backend's windowed KV-cache calls, and the per-sequence calls without
// decode in the allow-list, give the logprobs of the GPU policy's score (whose attention applies the same windows)
// within the tolerance, while the same weights without the windows score the sampled tokens far from them.
TEST(GpuSampler, SlidingWindowsLogprobsMatchScore) {
  RT_REQUIRE_GPU();
  constexpr int64_t kWindow = 16;
  std::mt19937_64 rng(testing::fresh_seed());
  for (const Arch arch : {Arch::Mistral, Arch::Qwen2}) {
    SCOPED_TRACE(model::arch_model_type(arch));
    model::ModelConfig c = sampler_config(arch);
    c.sliding_window = kWindow;
    if (arch == Arch::Qwen2) c.full_attention_layers = {true, false};
    const uint64_t weights = rng();
    std::unique_ptr<model::Policy> gpu = gpu_policy(c, weights);
    const auto prompts = prompts_of({5, 30, 3, 17, 1}, c.vocab, rng);
    model::SamplingParams s;
    s.max_new_tokens = 24, s.seed = rng();
    attention::reset_dispatch_counts();
    const std::vector<Generation> gens = model::Sampler(*gpu).generate(prompts, s);
    EXPECT_EQ(attention::dispatch_counts().forward[static_cast<int>(attention::BackendId::Decode)],
              c.layers * (s.max_new_tokens - 1));
    expect_logprobs_match_score(*gpu, prompts, gens);

    model::SamplerOptions o;
    o.attention_backends = {attention::BackendId::Flash, attention::BackendId::Efficient, attention::BackendId::Math};
    attention::reset_dispatch_counts();
    const std::vector<Generation> per_sequence = model::Sampler(*gpu, o).generate(prompts, s);
    EXPECT_EQ(attention::dispatch_counts().forward[static_cast<int>(attention::BackendId::Decode)], 0);
    expect_logprobs_match_score(*gpu, prompts, per_sequence);

    model::ModelConfig unwindowed = c;
    unwindowed.sliding_window = 0, unwindowed.full_attention_layers.clear();
    const model::TokenScores full = gpu_policy(unwindowed, weights)->score(continued(prompts, gens), false);
    double moved = 0;
    for (size_t b = 0; b < prompts.size(); ++b)
      for (size_t i = 0; i < gens[b].tokens.size(); ++i)
        moved = std::max<double>(moved, std::fabs(gens[b].logprobs[i] - full.logprobs[b][prompts[b].size() + i]));
    EXPECT_GT(moved, 4 * kLogprobTol) << "the windows changed nothing";
  }
}

TEST(GpuSampler, GreedyFollowsTheArgmaxAndTopKOneIsGreedy) {
  RT_REQUIRE_GPU();
  std::mt19937_64 rng(testing::fresh_seed());
  const model::ModelConfig c = sampler_config(Arch::Llama);
  std::unique_ptr<model::Policy> gpu = gpu_policy(c, rng());
  const auto prompts = prompts_of({6, 17, 2}, c.vocab, rng);
  model::SamplingParams greedy;
  greedy.temperature = 0, greedy.max_new_tokens = 8;
  model::Sampler sampler(*gpu);
  const std::vector<Generation> gens = sampler.generate(prompts, greedy);

  // The CPU fp32 model on the same bf16-rounded weights, teacher-forced along the GPU's tokens.
  const std::vector<float> host = gpu->params();
  model::Sampler cpu(c, host.data());
  std::unique_ptr<model::Policy> cpu_policy = model::make_policy(c, host, model::PolicyOptions{});
  const model::TokenScores cpu_scores = cpu_policy->score(continued(prompts, gens), false);
  int agree = 0, total = 0;
  for (size_t b = 0; b < prompts.size(); ++b)
    for (size_t i = 0; i < gens[b].tokens.size(); ++i) {
      EXPECT_EQ(gens[b].sampling_logprobs[i], 0.f);
      std::vector<int32_t> prefix = prompts[b];
      prefix.insert(prefix.end(), gens[b].tokens.begin(), gens[b].tokens.begin() + static_cast<int64_t>(i));
      model::SamplingParams one = greedy;
      one.max_new_tokens = 1;
      const Generation best = cpu.generate({prefix}, one)[0];
      const double mine = cpu_scores.logprobs[b][prompts[b].size() + i];
      ++total, agree += best.tokens[0] == gens[b].tokens[i];
      EXPECT_GE(mine, best.logprobs[0] - kLogprobTol - kLogprobRelTol * std::fabs(best.logprobs[0]))
          << "prompt " << b << " token " << i << ": the GPU chose " << gens[b].tokens[i] << " (CPU logprob " << mine
          << "), the CPU argmax is " << best.tokens[0] << " (" << best.logprobs[0] << ")";
    }
  std::printf("greedy: %d of %d tokens equal to the CPU fp32 argmax\n", agree, total);

  model::SamplingParams top1 = greedy;
  top1.temperature = 1, top1.top_k = 1, top1.seed = rng();
  const std::vector<Generation> again = sampler.generate(prompts, top1);
  for (size_t b = 0; b < prompts.size(); ++b) expect_identical(again[b], gens[b], cat("top-k 1, prompt ", b));
}

TEST(GpuSampler, SameSeedSameSamplesWhateverTheCompanions) {
  RT_REQUIRE_GPU();
  std::mt19937_64 rng(testing::fresh_seed());
  const model::ModelConfig c = sampler_config(Arch::Qwen2);
  std::unique_ptr<model::Policy> gpu = gpu_policy(c, rng());
  model::Sampler sampler(*gpu);
  model::SamplingParams s;
  s.temperature = 0.9, s.top_p = 0.95, s.top_k = 200, s.max_new_tokens = 10, s.seed = rng();
  const auto abc = prompts_of({7, 12, 4}, c.vocab, rng);
  const std::vector<uint64_t> ids{10, 11, 12};
  const std::vector<Generation> first = sampler.generate(abc, s, ids), second = sampler.generate(abc, s, ids);
  for (size_t b = 0; b < abc.size(); ++b) expect_identical(first[b], second[b], cat("rerun, prompt ", b));

  // Prompt A (id 10) moves to the middle, among other prompts of the same lengths as its old companions: the same
  // shapes, so the same kernels; its samples must not change.
  const auto others = prompts_of({4, 12}, c.vocab, rng);
  const std::vector<std::vector<int32_t>> moved{others[0], abc[0], others[1]};
  const std::vector<uint64_t> moved_ids{20, 10, 21};
  expect_identical(sampler.generate(moved, s, moved_ids)[1], first[0], "prompt A among other prompts");

  s.seed += 1;
  const std::vector<Generation> reseeded = sampler.generate(abc, s, ids);
  bool differs = false;
  for (size_t b = 0; b < abc.size(); ++b) differs |= reseeded[b].tokens != first[b].tokens;
  EXPECT_TRUE(differs) << "another seed gave the same samples";
}

TEST(GpuSampler, StopTokensEndSequences) {
  RT_REQUIRE_GPU();
  std::mt19937_64 rng(testing::fresh_seed());
  const model::ModelConfig c = sampler_config(Arch::Qwen3);
  std::unique_ptr<model::Policy> gpu = gpu_policy(c, rng());
  model::Sampler sampler(*gpu);
  const auto prompts = prompts_of({3, 9, 5, 14}, c.vocab, rng);
  model::SamplingParams s;
  s.temperature = 0, s.max_new_tokens = 10;
  const std::vector<Generation> full = sampler.generate(prompts, s);
  s.stop_tokens = {full[0].tokens[3], full[2].tokens[0]};
  const std::vector<Generation> stopped = sampler.generate(prompts, s);
  for (size_t b = 0; b < prompts.size(); ++b) {
    const auto& t = full[b].tokens;
    auto end = std::find_first_of(t.begin(), t.end(), s.stop_tokens.begin(), s.stop_tokens.end());
    const bool stops = end != t.end();
    const std::vector<int32_t> want(t.begin(), stops ? end + 1 : t.end());
    EXPECT_EQ(stopped[b].tokens, want) << "prompt " << b;
    EXPECT_EQ(stopped[b].finish, stops ? model::FinishReason::Stop : model::FinishReason::Length) << "prompt " << b;
    EXPECT_EQ(stopped[b].logprobs.size(), want.size());
  }
  EXPECT_EQ(stopped[0].finish, model::FinishReason::Stop);
  EXPECT_EQ(stopped[2].tokens.size(), 1u);
}

TEST(GpuSampler, TooLargeCacheIsAClearError) {
  RT_REQUIRE_GPU();
  std::mt19937_64 rng(testing::fresh_seed());
  const model::ModelConfig c = sampler_config(Arch::Mistral);
  std::unique_ptr<model::Policy> gpu = gpu_policy(c, rng());
  model::SamplerOptions o;
  // 2 prompts x (20 + 8 - 1) slots x 2 layers x (k, v) x 2 kv heads x 64 dims x 2 bytes = 55,296 bytes.
  o.max_cache_bytes = 55295;
  model::Sampler sampler(*gpu, o);
  model::SamplingParams s;
  s.max_new_tokens = 8;
  const auto prompts = prompts_of({20, 3}, c.vocab, rng);
  try {
    sampler.generate(prompts, s);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs 55296 bytes, more than max_cache_bytes = 55295"), std::string::npos)
        << e.what();
  }
  o.max_cache_bytes = 55296;
  EXPECT_EQ(model::Sampler(*gpu, o).generate(prompts, s).size(), 2u);
}

// ---- the sampling kernel alone ----
#ifdef RINGTRAIN_WITH_CUDA

struct Drawn {
  std::vector<int32_t> token, status;
  std::vector<float> logprob, sampling_logprob;
};

Drawn draw(const std::vector<float>& logits, int64_t rows, int64_t vocab, const model::SamplingParams& s,
           const std::vector<uint64_t>& ids, int64_t step) {
  const Device dev = Device::cuda(0);
  const Tensor x = Tensor::empty({rows, vocab}, DType::F32, dev), id = Tensor::empty({rows}, DType::I64, dev);
  copy(x, contiguous_view(const_cast<float*>(logits.data()), DType::F32, Device::cpu(), {rows, vocab}));
  copy(id, contiguous_view(const_cast<uint64_t*>(ids.data()), DType::I64, Device::cpu(), {rows}));
  const Tensor out = Tensor::empty({4 * rows}, DType::I32, dev);
  model::cuda::SampleArgs a;
  a.logits = x.ptr<float>(), a.rows = rows, a.vocab = vocab;
  a.temperature = static_cast<float>(s.temperature), a.top_k = s.top_k, a.top_p = static_cast<float>(s.top_p);
  a.seed = s.seed, a.sample_ids = reinterpret_cast<const uint64_t*>(id.ptr<int64_t>()), a.step = step;
  a.token = out.ptr<int32_t>(), a.logprob = reinterpret_cast<float*>(out.ptr<int32_t>() + rows);
  a.sampling_logprob = reinterpret_cast<float*>(out.ptr<int32_t>() + 2 * rows);
  a.status = out.ptr<int32_t>() + 3 * rows;
  model::cuda::sample_rows(nullptr, a);
  std::vector<int32_t> host(static_cast<size_t>(4 * rows));
  copy(contiguous_view(host.data(), DType::I32, Device::cpu(), {4 * rows}), out.view());
  Drawn d;
  d.token.assign(host.begin(), host.begin() + rows);
  d.status.assign(host.begin() + 3 * rows, host.end());
  d.logprob.resize(static_cast<size_t>(rows)), d.sampling_logprob.resize(static_cast<size_t>(rows));
  std::memcpy(d.logprob.data(), host.data() + rows, static_cast<size_t>(rows) * 4);
  std::memcpy(d.sampling_logprob.data(), host.data() + 2 * rows, static_cast<size_t>(rows) * 4);
  return d;
}

// The processed distribution as generate.h defines it (distinct logits: no ties), in fp64.
std::vector<double> processed(const std::vector<double>& lp, const model::SamplingParams& s) {
  const int64_t V = static_cast<int64_t>(lp.size());
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return lp[a] > lp[b]; });
  int64_t kept = s.top_k > 0 ? std::min(s.top_k, V) : V;
  std::vector<double> w(static_cast<size_t>(kept));
  for (int64_t i = 0; i < kept; ++i) w[i] = std::exp((lp[order[i]] - lp[order[0]]) / s.temperature);
  const double total = std::accumulate(w.begin(), w.end(), 0.0);
  if (s.top_p < 1) {
    double mass = 0;
    int64_t n = 0;
    while (n < kept && mass < s.top_p * total) mass += w[n++];
    kept = n;
  }
  const double z = std::accumulate(w.begin(), w.begin() + kept, 0.0);
  std::vector<double> q(static_cast<size_t>(V), 0.0);
  for (int64_t i = 0; i < kept; ++i) q[order[i]] = w[i] / z;
  return q;
}

// V logits drawn from N(0, 2^2), and `rows` copies of them.
std::vector<float> normal_row(int64_t V, std::mt19937_64& rng) {
  std::normal_distribution<double> n(0, 2);
  std::vector<float> row(static_cast<size_t>(V));
  for (float& x : row) x = static_cast<float>(n(rng));
  return row;
}
std::vector<float> repeated(const std::vector<float>& row, int64_t rows) {
  std::vector<float> out;
  for (int64_t r = 0; r < rows; ++r) out.insert(out.end(), row.begin(), row.end());
  return out;
}

void check_draws() {
  std::mt19937_64 rng(testing::fresh_seed());
  const int64_t V = 300, rows = 65536;
  const std::vector<float> row = normal_row(V, rng);
  std::vector<double> lp(row.begin(), row.end());
  const double mx = *std::max_element(lp.begin(), lp.end());
  double z = 0;
  for (double x : lp) z += std::exp(x - mx);
  for (double& x : lp) x -= mx + std::log(z);
  const std::vector<float> logits = repeated(row, rows);
  std::vector<uint64_t> ids(static_cast<size_t>(rows));
  std::iota(ids.begin(), ids.end(), uint64_t{1000});

  struct Setting {
    double temperature, top_p;
    int64_t top_k;
  };
  for (const Setting& set :
       {Setting{1.0, 1.0, 0}, Setting{0.7, 1.0, 20}, Setting{1.3, 0.8, 0}, Setting{1.0, 0.5, 50}}) {
    model::SamplingParams s;
    s.temperature = set.temperature, s.top_p = set.top_p, s.top_k = set.top_k, s.seed = rng();
    const std::vector<double> q = processed(lp, s);
    const Drawn d = draw(logits, rows, V, s, ids, 3);
    std::vector<int64_t> count(static_cast<size_t>(V), 0);
    for (int64_t r = 0; r < rows; ++r) {
      const int32_t t = d.token[static_cast<size_t>(r)];
      ASSERT_EQ(d.status[static_cast<size_t>(r)], 0);
      ASSERT_TRUE(t >= 0 && t < V);
      ASSERT_GT(q[t], 0.0) << "token " << t << " is outside the kept set (T " << s.temperature << ", top-k "
                           << s.top_k << ", top-p " << s.top_p << ")";
      ASSERT_NEAR(d.logprob[static_cast<size_t>(r)], lp[t], 1e-5);
      ASSERT_NEAR(d.sampling_logprob[static_cast<size_t>(r)], std::log(q[t]), 1e-4);
      ++count[t];
    }
    std::vector<int32_t> likeliest(static_cast<size_t>(V));
    std::iota(likeliest.begin(), likeliest.end(), 0);
    std::sort(likeliest.begin(), likeliest.end(), [&](int32_t a, int32_t b) { return q[a] > q[b]; });
    for (int i = 0; i < 10; ++i) {
      const int32_t t = likeliest[static_cast<size_t>(i)];
      const double sigma = std::sqrt(q[t] * (1 - q[t]) / rows);
      EXPECT_LE(std::fabs(static_cast<double>(count[t]) / rows - q[t]), 5 * sigma + 1e-12)
          << "token " << t << " drawn " << count[t] << " times of " << rows << ", probability " << q[t];
    }
    // The same (seed, id, step) draws the same token in another row; another step draws anew.
    std::vector<uint64_t> reversed(ids.rbegin(), ids.rend());
    const Drawn back = draw(logits, rows, V, s, reversed, 3), later = draw(logits, rows, V, s, ids, 4);
    int64_t same_later = 0;
    for (int64_t r = 0; r < rows; ++r) {
      ASSERT_EQ(back.token[static_cast<size_t>(rows - 1 - r)], d.token[static_cast<size_t>(r)]);
      same_later += later.token[static_cast<size_t>(r)] == d.token[static_cast<size_t>(r)];
    }
    // Unless the kept set is one token (top-p 0.5 keeps only the likeliest where it holds half the mass).
    if (std::count_if(q.begin(), q.end(), [](double x) { return x > 0; }) > 1) EXPECT_LT(same_later, rows);
  }
}

// Top-p with its crossing at a token boundary (the share of the m likeliest tokens' mass, so that where the kept
// set ends is decided within rounding): every row, all with the same logits and the same (seed, id, step), must draw
// the same token with the same logprobs, bit for bit. Each row is its own block, whose atomic additions land in
// their own order; a histogram summed in floats could keep m tokens in some rows and m + 1 in others.
void check_top_p_at_a_boundary_is_reproducible() {
  std::mt19937_64 rng(testing::fresh_seed());
  const int64_t V = 32000, rows = 512;
  const std::vector<float> row = normal_row(V, rng);
  std::vector<double> w(row.begin(), row.end());
  std::sort(w.begin(), w.end(), std::greater<>());
  const double mx = w[0];
  for (double& x : w) x = std::exp(x - mx);
  const double total = std::accumulate(w.begin(), w.end(), 0.0);
  const std::vector<float> logits = repeated(row, rows);
  const std::vector<uint64_t> ids(static_cast<size_t>(rows), 77);
  for (int64_t m : {2, 17, 300}) {
    model::SamplingParams s;
    s.temperature = 1, s.top_k = 0, s.seed = rng();
    const double z_m = std::accumulate(w.begin(), w.begin() + m, 0.0), z_m1 = z_m + w[static_cast<size_t>(m)];
    s.top_p = z_m / total;
    const Drawn d = draw(logits, rows, V, s, ids, 5);
    const int32_t t = d.token[0];
    ASSERT_EQ(d.status[0], 0);
    const double lp_t = row[static_cast<size_t>(t)] - mx;  // the token's unnormalised log mass
    EXPECT_LE(std::min(std::fabs(d.sampling_logprob[0] - (lp_t - std::log(z_m))),
                       std::fabs(d.sampling_logprob[0] - (lp_t - std::log(z_m1)))),
              1e-4)
        << "kept set of neither " << m << " nor " << m + 1 << " tokens";
    for (int64_t r = 1; r < rows; ++r) {
      const size_t i = static_cast<size_t>(r);
      ASSERT_EQ(d.token[i], d.token[0]) << "row " << r << ", crossing after " << m << " tokens";
      ASSERT_EQ(d.sampling_logprob[i], d.sampling_logprob[0]) << "row " << r << ", crossing after " << m << " tokens";
      ASSERT_EQ(d.logprob[i], d.logprob[0]) << "row " << r;
    }
  }
}

void check_greedy_tie_and_nan() {
  const int64_t V = 5000;
  std::vector<float> logits(static_cast<size_t>(2 * V), -1.f);
  logits[4001] = logits[17] = 3.f;  // row 0: a tie at the top
  logits[V + 9] = std::nanf("");    // row 1: a NaN
  model::SamplingParams s;
  s.temperature = 0;
  const Drawn d = draw(logits, 2, V, s, {0, 1}, 0);
  EXPECT_EQ(d.status[0], 0);
  EXPECT_EQ(d.token[0], 17);
  EXPECT_EQ(d.sampling_logprob[0], 0.f);
  EXPECT_NEAR(d.logprob[0], 3.0 - std::log(2 * std::exp(3.0) + (V - 2) * std::exp(-1.0)), 1e-5);
  EXPECT_EQ(d.status[1], 1);
}
#endif  // RINGTRAIN_WITH_CUDA

TEST(GpuSampleKernel, DrawsFromTheProcessedDistribution) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_draws());
}

TEST(GpuSampleKernel, TopPAtATokenBoundaryIsReproducible) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_top_p_at_a_boundary_is_reproducible());
}

TEST(GpuSampleKernel, GreedyTakesTheLowestIdOnATieAndNaNIsReported) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_greedy_tie_and_nan());
}

}  // namespace
}  // namespace ringtrain
