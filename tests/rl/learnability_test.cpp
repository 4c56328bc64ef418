// Opt-in experiment (RINGTRAIN_RL_EXPERIMENT=1), not a CI test: is the built-in task learnable by a tiny policy on a
// CPU? An SFT warm-up on reference answers (AdamW from train/optimizer.h), evaluated with the sampler, then a plain
// on-policy GRPO loop (group-normalised advantages, one update per batch, so no ratio clipping is needed) from the
// warmed-up policy. Prints reward curves and timings; the assertions are the levels the task is meant to reach.
//   RINGTRAIN_RL_SFT_STEPS (default 300), RINGTRAIN_RL_WARMUP_STEPS (GRPO's start, default 100),
//   RINGTRAIN_RL_GRPO_STEPS (default 100), RINGTRAIN_RL_GRPO_LR (default 1e-3), RINGTRAIN_RL_HIDDEN (default 64).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>

#include "ringtrain/model/generate.h"
#include "ringtrain/model/params.h"
#include "ringtrain/model/policy.h"
#include "ringtrain/rl/task.h"
#include "ringtrain/rl/tokenizer.h"
#include "ringtrain/train/optimizer.h"
#include "rl_test_util.h"
#include "train/host_adamw.h"

namespace ringtrain {
namespace {

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v ? std::stoll(v) : fallback;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct TinyRun {
  rl::CharTokenizer tok;
  rl::ReverseDigitsTask task{1234, 3, 5};
  model::ModelConfig config;
  std::unique_ptr<model::Policy> policy;
  std::unique_ptr<train::AdamW<float>> opt;

  explicit TinyRun(int64_t hidden) {
    config.arch = model::Arch::Llama;
    config.vocab = tok.vocab_size(), config.hidden = hidden, config.layers = 2, config.heads = 4;
    config.kv_heads = 2, config.head_dim = hidden / 4, config.ffn = 2 * hidden, config.max_positions = 32;
    config.rms_eps = 1e-5;
    const model::ParamLayout layout(config);
    policy = model::make_policy(config, model::random_params(layout, 7), model::PolicyOptions{});
    train::AdamWConfig adam;
    adam.weight_decay = 0.0;
    opt = std::make_unique<train::AdamW<float>>(adam, 0, layout.total());
  }

  // Sequences prompt + response; d_logprobs = weight[b] on response tokens. One AdamW step.
  void update(const std::vector<std::vector<int32_t>>& prompts, const std::vector<std::vector<int32_t>>& responses,
              const std::vector<double>& weight, double lr) {
    model::TokenBatch batch;
    std::vector<std::vector<float>> d;
    for (size_t b = 0; b < prompts.size(); ++b) {
      batch.sequences.push_back(prompts[b]);
      batch.sequences.back().insert(batch.sequences.back().end(), responses[b].begin(), responses[b].end());
      d.emplace_back(batch.sequences.back().size(), 0.f);
      for (size_t p = prompts[b].size(); p < d.back().size(); ++p) d.back()[p] = static_cast<float>(weight[b]);
    }
    policy->zero_grads();
    policy->score(batch, true);
    policy->backward(d);
    const TensorView w = policy->weights(), g = policy->grads();
    const std::span<float> master(static_cast<float*>(w.data), static_cast<size_t>(w.numel()));
    const std::span<const float> grad(static_cast<const float*>(g.data), static_cast<size_t>(g.numel()));
    opt->step(master, grad, lr, train::sum_of_squares<float>(grad));
  }

  // Mean partial and exact reward over held-out examples (indices far from the training stream).
  std::pair<double, double> evaluate(model::Sampler& sampler, const model::SamplingParams& s, int64_t n) {
    const std::vector<rl::Example> ex = task.examples(uint64_t{1} << 40, n);
    std::vector<std::vector<int32_t>> prompts;
    for (const rl::Example& e : ex) prompts.push_back(tok.encode_prompt(e.prompt));
    return rl::testing::mean_rewards(ex, sampler.generate(prompts, s));
  }
};

model::SamplingParams sampling(double temperature, uint64_t seed) {
  model::SamplingParams s;
  s.temperature = temperature, s.max_new_tokens = 8, s.stop_tokens = {rl::CharTokenizer::kEos}, s.seed = seed;
  return s;
}

TEST(RlLearnability, SftThenGrpo) {
  if (!std::getenv("RINGTRAIN_RL_EXPERIMENT")) GTEST_SKIP() << "set RINGTRAIN_RL_EXPERIMENT=1 to run the experiment";
  const int64_t sft_steps = env_int("RINGTRAIN_RL_SFT_STEPS", 300), warmup = env_int("RINGTRAIN_RL_WARMUP_STEPS", 100);
  const int64_t grpo_steps = env_int("RINGTRAIN_RL_GRPO_STEPS", 100), hidden = env_int("RINGTRAIN_RL_HIDDEN", 64);
  const double grpo_lr = std::getenv("RINGTRAIN_RL_GRPO_LR") ? std::stod(std::getenv("RINGTRAIN_RL_GRPO_LR")) : 1e-3;
  constexpr int64_t kBatch = 32, kEval = 256;

  // SFT curve from scratch.
  if (sft_steps > 0) {
    TinyRun run(hidden);
    model::Sampler sampler(*run.policy);
    const auto t0 = std::chrono::steady_clock::now();
    double sft_time = 0;
    for (int64_t step = 0; step <= sft_steps; ++step) {
      if (step % 20 == 0 || step == sft_steps) {
        const auto [g_partial, g_exact] = run.evaluate(sampler, sampling(0, 0), kEval);
        const auto [s_partial, s_exact] = run.evaluate(sampler, sampling(1, step), kEval);
        std::printf("sft step %4lld  greedy partial %.3f exact %.3f  T=1 partial %.3f exact %.3f  (%.1f s training)\n",
                    static_cast<long long>(step), g_partial, g_exact, s_partial, s_exact, sft_time);
        std::fflush(stdout);
        if (step == sft_steps) {
          EXPECT_GT(g_partial, 0.8);
        }
      }
      if (step == sft_steps) break;
      const auto t1 = std::chrono::steady_clock::now();
      std::vector<std::vector<int32_t>> prompts, answers;
      for (const rl::Example& e : run.task.examples(static_cast<uint64_t>(step * kBatch), kBatch)) {
        prompts.push_back(run.tok.encode_prompt(e.prompt));
        answers.push_back(run.tok.encode_answer(e.answer));
      }
      int64_t tokens = 0;
      for (const auto& a : answers) tokens += static_cast<int64_t>(a.size());
      // Mean NLL over answer tokens: gradient of -sum(logprob) / tokens.
      run.update(prompts, answers, std::vector<double>(kBatch, -1.0 / static_cast<double>(tokens)), 3e-3);
      sft_time += seconds_since(t1);
    }
    std::printf("sft: %.2f s per step on average, %.1f s wall with evaluations\n",
                sft_time / static_cast<double>(sft_steps), seconds_since(t0));
  }

  // GRPO from a short warm-up: 8 prompts x a group of 8 samples per step.
  TinyRun run(hidden);
  model::Sampler sampler(*run.policy);
  for (int64_t step = 0; step < warmup; ++step) {
    std::vector<std::vector<int32_t>> prompts, answers;
    for (const rl::Example& e : run.task.examples(static_cast<uint64_t>(step * kBatch), kBatch)) {
      prompts.push_back(run.tok.encode_prompt(e.prompt));
      answers.push_back(run.tok.encode_answer(e.answer));
    }
    int64_t tokens = 0;
    for (const auto& a : answers) tokens += static_cast<int64_t>(a.size());
    run.update(prompts, answers, std::vector<double>(kBatch, -1.0 / static_cast<double>(tokens)), 3e-3);
  }
  constexpr int64_t kPrompts = 8, kGroup = 8;
  double first = -1, last = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t step = 0; step <= grpo_steps; ++step) {
    if (step % 10 == 0) {
      const auto [g_partial, g_exact] = run.evaluate(sampler, sampling(0, 0), kEval);
      const auto [s_partial, s_exact] = run.evaluate(sampler, sampling(1, 1000 + step), kEval);
      std::printf("grpo step %3lld  greedy partial %.3f exact %.3f  T=1 partial %.3f exact %.3f  (%.1f s)\n",
                  static_cast<long long>(step), g_partial, g_exact, s_partial, s_exact, seconds_since(t0));
      std::fflush(stdout);
      if (first < 0) first = s_partial;
      last = s_partial;
    }
    if (step == grpo_steps) break;
    const std::vector<rl::Example> ex = run.task.examples(uint64_t{1} << 20 | static_cast<uint64_t>(step * kPrompts),
                                                          kPrompts);
    std::vector<std::vector<int32_t>> prompts;
    for (const rl::Example& e : ex)
      for (int64_t g = 0; g < kGroup; ++g) prompts.push_back(run.tok.encode_prompt(e.prompt));
    const std::vector<model::Generation> gens = sampler.generate(prompts, sampling(1, 77 + step));
    std::vector<std::vector<int32_t>> responses;
    std::vector<double> rewards, weight;
    int64_t tokens = 0;
    for (size_t i = 0; i < gens.size(); ++i) {
      responses.push_back(gens[i].tokens);
      rewards.push_back(rl::reward(run.tok, ex[i / kGroup].answer, gens[i].tokens, rl::RewardMode::Partial));
      tokens += static_cast<int64_t>(gens[i].tokens.size());
    }
    for (size_t i = 0; i < gens.size(); ++i) {
      const size_t g0 = i / kGroup * kGroup;
      const double mean = std::accumulate(rewards.begin() + g0, rewards.begin() + g0 + kGroup, 0.0) / kGroup;
      double var = 0;
      for (size_t j = g0; j < g0 + kGroup; ++j) var += (rewards[j] - mean) * (rewards[j] - mean);
      const double advantage = (rewards[i] - mean) / (std::sqrt(var / kGroup) + 1e-6);
      // Token-mean policy gradient: maximise sum A * logprob / tokens.
      weight.push_back(-advantage / static_cast<double>(tokens));
    }
    run.update(prompts, responses, weight, grpo_lr);
  }
  // What the policy answers at the end (greedy).
  const std::vector<rl::Example> shown = run.task.examples(uint64_t{1} << 40, 8);
  for (const rl::Example& e : shown) {
    const model::Generation g = sampler.generate({run.tok.encode_prompt(e.prompt)}, sampling(0, 0))[0];
    std::printf("  %-7s -> %-12s (want %s)\n", e.prompt.c_str(), run.tok.decode(g.tokens).c_str(), e.answer.c_str());
  }
  EXPECT_GT(last, first + 0.1) << "GRPO did not raise the sampled reward";
  EXPECT_GT(last, 0.8);
}

}  // namespace
}  // namespace ringtrain
