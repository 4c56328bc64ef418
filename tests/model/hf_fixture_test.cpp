// Golden outputs from Hugging Face transformers (scripts/make_model_fixtures.py, torch 2.11 + transformers 5.17,
// fp32, SDPA attention): per-token log-probabilities of fixed sequences and the gradient of their sum w.r.t.
// named weights, for tiny random Llama (llama3 RoPE scaling), Qwen2 (q/k/v bias, bf16 file), Qwen3 (q/k norm,
// head_dim != hidden/heads, tied, bf16), Mistral (fp16, sharded with an index) checkpoints, and a checkpoint
// written by `ringtrain init-model` that transformers loaded.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <unistd.h>
#include <random>

#include <nlohmann/json.hpp>

#include "model_test_util.h"
#include "ringtrain/core/error.h"
#include "ringtrain/model/file_io.h"
#include "ringtrain/model/layers.h"
#include "ringtrain/model/logprobs.h"
#include "test_util.h"

namespace ringtrain {
namespace {

using nlohmann::json;

json expected(const std::string& name) {
  return json::parse(model::read_file(testing::model_fixture_dir(name) / "expected.json"));
}

class HfFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(HfFixture, LogprobsAndGradientsMatchTransformers) {
  const json exp = expected(GetParam());
  ASSERT_FALSE(exp.contains("load_error")) << "transformers could not load it: " << exp["load_error"];
  std::mt19937_64 rng(testing::fresh_seed());
  model::Model<float> m = model::Model<float>::load(testing::model_fixture_dir(GetParam()) / "checkpoint");
  auto attn = model::make_local_attention();
  const auto seqs = exp["sequences"].get<std::vector<std::vector<int32_t>>>();
  const auto ref_lp = exp["logprobs_fp32"].get<std::vector<std::vector<double>>>();
  m.zero_grads();
  double worst_lp = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int64_t chunk = 1 + static_cast<int64_t>(rng() % (2 * seqs[s].size()));  // any chunking, same result
    const std::vector<float> lp = model::sequence_logprobs(m, seqs[s], *attn, chunk, /*for_backward=*/true);
    ASSERT_EQ(lp.size(), ref_lp[s].size());
    EXPECT_EQ(lp[0], 0.f);
    for (size_t p = 0; p < lp.size(); ++p) {
      ASSERT_TRUE(std::isfinite(lp[p])) << p;
      worst_lp = std::max(worst_lp, std::fabs(lp[p] - ref_lp[s][p]));
    }
    model::sequence_logprobs_backward(m, seqs[s], std::vector<float>(lp.size(), 1.f), *attn, chunk);
  }
  // Both sides compute in fp32 with different reduction orders; logprobs near log(1/256) ≈ -5.5 agree to ~1e-6.
  EXPECT_LE(worst_lp, 1e-4) << "max |logprob - transformers|";
  std::printf("[%s] max |logprob error| = %.3g\n", GetParam().c_str(), worst_lp);

  for (const auto& [name, values] : exp["grads_fp32"].items()) {
    const model::ParamSpec* spec = m.layout().find(name);
    ASSERT_NE(spec, nullptr) << name;
    const std::vector<double> ref = values.get<std::vector<double>>();
    ASSERT_EQ(static_cast<int64_t>(ref.size()), spec->numel) << name;
    const TensorView got = contiguous_view(m.grads().data() + spec->offset, DType::F32, Device::cpu(), {spec->numel});
    const TensorView want = contiguous_view(const_cast<double*>(ref.data()), DType::F64, Device::cpu(), {spec->numel});
    // fp32 gradients summed over ~40 tokens through two layers: ~1e-6 relative; 1e-4 rejects any wrong term.
    const double err = testing::rel_error(got, want);
    EXPECT_LE(err, 1e-4) << name;
    std::printf("[%s] %s rel L2 error %.3g\n", GetParam().c_str(), name.c_str(), err);
  }

  if (exp["rope_inv_freq"].is_array()) {  // transformers' inv_freq buffer, llama3 scaling included
    const auto ref = exp["rope_inv_freq"].get<std::vector<double>>();
    const std::vector<float> got = model::rope_inv_freq(m.config().rope, m.config().head_dim);
    ASSERT_EQ(got.size(), ref.size());
    for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(got[i], ref[i], 2e-7 * ref[i]) << i;  // ≤ 1-2 fp32 ulp
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, HfFixture,
                         ::testing::Values("llama", "qwen2", "qwen3", "mistral", "ringtrain_written"),
                         [](const auto& info) { return info.param; });

TEST(LogprobsCli, MatchesTransformersAndReportsBadLines) {
  const json exp = expected("llama");
  const auto seqs = exp["sequences"].get<std::vector<std::vector<int32_t>>>();
  const auto ref_lp = exp["logprobs_fp32"].get<std::vector<std::vector<double>>>();
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / cat("rt_logprobs_cli_", ::getpid());
  std::filesystem::create_directories(dir);
  {
    std::ofstream data(dir / "data.jsonl");
    for (const auto& s : seqs) data << json{{"input_ids", s}}.dump() << "\n";
  }
  for (int cp : {1, 2}) {
    const std::filesystem::path out = dir / cat("out", cp, ".jsonl");
    const std::string cmd = cat(testing::cli_program(), " logprobs --model ", testing::model_fixture_dir("llama") / "checkpoint",
                                " --data ", dir / "data.jsonl", " --cp ", cp, " --chunk 5 --out ", out);
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    std::ifstream in(out);
    std::string line;
    size_t n = 0;
    for (; std::getline(in, line); ++n) {
      ASSERT_LT(n, seqs.size());
      const auto lp = json::parse(line).at("logprobs").get<std::vector<double>>();
      ASSERT_EQ(lp.size(), ref_lp[n].size());
      for (size_t p = 0; p < lp.size(); ++p) EXPECT_NEAR(lp[p], ref_lp[n][p], 1e-4) << "cp " << cp << " line " << n;
    }
    EXPECT_EQ(n, seqs.size());
  }
  {
    std::ofstream data(dir / "bad.jsonl");
    data << json{{"input_ids", seqs[0]}}.dump() << "\n{\"input_ids\": [1, 2\n";
  }
  const std::string bad = cat(testing::cli_program(), " logprobs --model ", testing::model_fixture_dir("llama") / "checkpoint",
                              " --data ", dir / "bad.jsonl", " 2>", dir / "err.txt");
  EXPECT_NE(std::system(bad.c_str()), 0);
  const std::string err = model::read_file(dir / "err.txt");
  EXPECT_NE(err.find("bad.jsonl:2: invalid JSON"), std::string::npos) << err;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ringtrain
