// The sampler over a GPU Policy (model/generate.h): it reads the weights through params() into a host fp32 copy at
// every generate() and decodes on the host. Against: a sampler over the downloaded weights (the same host
// computation: identical results), the GPU policy's own score of the sampled sequences (bf16 device compute against
// fp32 host compute on the same bf16 weights, transformers' initialisation: the GPU policy test's logprob tolerance,
// 2e-2 absolute plus two bf16 ulps of the magnitude), and a
// set_params on the GPU policy, which the next generate() must see. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "model/model_test_util.h"
#include "ringtrain/model/generate.h"
#include "ringtrain/model/params.h"
#include "ringtrain/model/policy.h"
#include "test_util.h"

namespace ringtrain {
namespace {

constexpr double kLogprobTol = 2e-2;
constexpr double kLogprobRelTol = 1.0 / 128;

void expect_identical(const std::vector<model::Generation>& a, const std::vector<model::Generation>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens) << "sequence " << i;
    EXPECT_EQ(a[i].logprobs, b[i].logprobs) << "sequence " << i;
  }
}

TEST(GpuSampler, ReadsTheGpuPolicyThroughTheHost) {
  RT_REQUIRE_GPU();
  std::mt19937_64 rng(testing::fresh_seed());
  model::ModelConfig c = testing::tiny_config(model::Arch::Qwen2);
  c.hidden = 128, c.heads = 4, c.kv_heads = 2, c.head_dim = 64, c.ffn = 256, c.vocab = 500;
  model::PolicyOptions gpu_options;
  gpu_options.device = Device::cuda(0);
  gpu_options.dtype = DType::BF16;
  std::unique_ptr<model::Policy> gpu = model::make_policy(c, model::random_params(model::ParamLayout(c), rng()), gpu_options);
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t n : {5, 12, 3}) prompts.push_back(testing::random_ids(n, c.vocab, rng));
  model::SamplingParams s;
  s.max_new_tokens = 8, s.seed = rng();

  model::Sampler sampler(*gpu);
  const std::vector<model::Generation> gens = sampler.generate(prompts, s);
  std::vector<float> host = gpu->params();
  expect_identical(gens, model::Sampler(c, host.data()).generate(prompts, s));

  model::TokenBatch batch;
  for (size_t b = 0; b < prompts.size(); ++b) {
    batch.sequences.push_back(prompts[b]);
    batch.sequences.back().insert(batch.sequences.back().end(), gens[b].tokens.begin(), gens[b].tokens.end());
  }
  const model::TokenScores scores = gpu->score(batch, false);
  for (size_t b = 0; b < prompts.size(); ++b)
    for (size_t i = 0; i < gens[b].tokens.size(); ++i)
      ASSERT_LE(std::fabs(gens[b].logprobs[i] - scores.logprobs[b][prompts[b].size() + i]),
                kLogprobTol + kLogprobRelTol * std::fabs(gens[b].logprobs[i]))
          << "prompt " << b << " token " << i << ": " << gens[b].logprobs[i] << " vs "
          << scores.logprobs[b][prompts[b].size() + i];

  gpu->set_params(model::random_params(model::ParamLayout(c), rng()));
  const std::vector<model::Generation> after = sampler.generate(prompts, s);
  host = gpu->params();
  expect_identical(after, model::Sampler(c, host.data()).generate(prompts, s));
  bool changed = false;
  for (size_t b = 0; b < prompts.size(); ++b) changed |= after[b].logprobs != gens[b].logprobs;
  EXPECT_TRUE(changed) << "the new weights were not used";
}

}  // namespace
}  // namespace ringtrain
