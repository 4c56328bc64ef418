// `bench rollouts` on the CPU, small: the lengths of the mix are log-uniform within bounds and deterministic; every
// row's real and processed token counts equal the ones counted here from the lengths (packed rows hold no padding,
// padded microbatches are consecutive runs padded to their longest); the packed, padded and bucketed layouts score
// the same logprobs (fp32, 1e-5) and take the same first train step; the command prints a well-formed report and
// writes the same JSON, and refuses a padded batch that does not divide the mix.
#include "ringtrain/worker/bench_rollouts.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "ringtrain/comm/in_process.h"
#include "test_util.h"

namespace ringtrain::worker {
namespace {

namespace fs = std::filesystem;
constexpr auto kTimeout = std::chrono::seconds(60);

using testing::max_ragged_diff;

const nlohmann::json& row(const nlohmann::json& report, const std::string& layout, const std::string& pass) {
  for (const auto& r : report["rows"])
    if (r["layout"] == layout && r["pass"] == pass) return r;
  throw std::runtime_error("no row " + layout + " " + pass);
}

// Token counts of the report against counts made here from the lengths alone.
void check_counts(const nlohmann::json& report, const std::vector<int64_t>& lengths, int64_t padded_batch,
                  int64_t long_len, bool train) {
  int64_t total = 0, padded = 0;
  for (int64_t len : lengths) total += len;
  for (size_t first = 0; first < lengths.size(); first += static_cast<size_t>(padded_batch)) {
    int64_t longest = 0, count = 0;
    for (size_t i = first; i < std::min(lengths.size(), first + static_cast<size_t>(padded_batch)); ++i)
      longest = std::max(longest, lengths[i]), ++count;
    padded += longest * count;
  }
  EXPECT_EQ(report["mix"]["tokens"].get<int64_t>(), total);
  const int64_t long_seqs = (total + long_len - 1) / long_len;
  for (const std::string pass : {"logprobs", "train"}) {
    if (pass == "train" && !train) continue;
    const nlohmann::json &packed = row(report, "packed", pass), &pad = row(report, "padded", pass),
                         &lng = row(report, "long", pass);
    EXPECT_EQ(packed["tokens"].get<int64_t>(), total) << pass;
    EXPECT_EQ(packed["processed_tokens"].get<int64_t>(), total) << pass;  // no padding in a packed row
    EXPECT_EQ(packed["sequences"].get<size_t>(), lengths.size()) << pass;
    EXPECT_EQ(pad["tokens"].get<int64_t>(), total) << pass;
    EXPECT_EQ(pad["processed_tokens"].get<int64_t>(), padded) << pass;
    EXPECT_EQ(pad["microbatches"].get<size_t>(), (lengths.size() + padded_batch - 1) / padded_batch) << pass;
    EXPECT_EQ(lng["tokens"].get<int64_t>(), total) << pass;
    EXPECT_EQ(lng["processed_tokens"].get<int64_t>(), total) << pass;
    EXPECT_EQ(lng["sequences"].get<int64_t>(), long_seqs) << pass;
    for (const nlohmann::json* r : {&packed, &pad, &lng}) {
      EXPECT_GT((*r)["seconds"].get<double>(), 0.0) << pass;
      const double tps = (*r)["tokens_per_s"].get<double>();
      EXPECT_NEAR(tps, total / (*r)["seconds"].get<double>(), 1e-6 * tps) << pass;
    }
    const nlohmann::json& q = report["ratios"][pass];
    EXPECT_NEAR(q["packed_over_padded"].get<double>(),
                packed["tokens_per_s"].get<double>() / pad["tokens_per_s"].get<double>(), 1e-9)
        << pass;
    EXPECT_NEAR(q["packed_over_long"].get<double>(),
                packed["tokens_per_s"].get<double>() / lng["tokens_per_s"].get<double>(), 1e-9)
        << pass;
  }
}

TEST(BenchRollouts, LengthsAreLogUniformWithinBoundsAndDeterministic) {
  const std::vector<int64_t> a = rollout_lengths(4000, 64, 16384, 3);
  EXPECT_EQ(a, rollout_lengths(4000, 64, 16384, 3));
  EXPECT_NE(a, rollout_lengths(4000, 64, 16384, 4));
  int below_1024 = 0;
  for (int64_t len : a) {
    ASSERT_GE(len, 64);
    ASSERT_LE(len, 16384);
    below_1024 += len < 1024;
  }
  // log-uniform: P(len < 1024) = log(16) / log(256) = 1/2 (a uniform mix would give 6%).
  EXPECT_NEAR(below_1024 / 4000.0, 0.5, 0.04);
}

TEST(BenchRollouts, LayoutsScoreAndTrainAlikeAndCountTokensExactly) {
  BenchRolloutsOptions o;
  o.model_name = "builtin:tiny";
  o.sequences = 9, o.min_len = 3, o.max_len = 48, o.seed = testing::fresh_seed();
  o.mb_tokens = 64, o.padded_batch = 3, o.long_len = 40;
  o.dynamic = true;
  o.loss = "clipped_pg";
  o.iters = 2, o.warmup = 1;
  nlohmann::json report;
  std::map<std::string, LogprobResult> scores;
  comm::run_ranks(1, kTimeout, [&](comm::Communicator& world) { report = run_rollouts_bench(o, world, &scores); });

  const std::vector<int64_t> lengths = rollout_lengths(o.sequences, o.min_len, o.max_len, o.seed);
  EXPECT_EQ(report["mix"]["lengths"].get<std::vector<int64_t>>(), lengths);
  check_counts(report, lengths, o.padded_batch, o.long_len, true);

  ASSERT_EQ(scores.size(), 4u);
  for (const std::string layout : {"packed", "padded", "dynamic"}) {
    const std::vector<std::vector<float>>& lp = scores.at(layout).logprobs;
    ASSERT_EQ(lp.size(), lengths.size()) << layout;
    for (size_t i = 0; i < lp.size(); ++i) {
      ASSERT_EQ(static_cast<int64_t>(lp[i].size()), lengths[i]) << layout << " sequence " << i;
      EXPECT_EQ(lp[i][0], 0.0f) << layout << " sequence " << i;
      for (size_t p = 1; p < lp[i].size(); ++p) ASSERT_LT(lp[i][p], 0.0f) << layout << " sequence " << i;
    }
  }
  const double packed_vs_padded = max_ragged_diff(scores.at("packed").logprobs, scores.at("padded").logprobs);
  EXPECT_LE(packed_vs_padded, 1e-5);
  EXPECT_LE(max_ragged_diff(scores.at("dynamic").logprobs, scores.at("padded").logprobs), 1e-5);
  EXPECT_DOUBLE_EQ(report["logprobs_max_abs_diff_packed_vs_padded"].get<double>(), packed_vs_padded);
  // The long layout's sequences are its own: one per 40 tokens of the total.
  int64_t long_total = 0;
  for (const auto& lp : scores.at("long").logprobs) long_total += static_cast<int64_t>(lp.size());
  EXPECT_EQ(long_total, report["mix"]["tokens"].get<int64_t>());

  // The first train step of every batching layout starts from the same weights and samples.
  const double loss = row(report, "padded", "train")["first_loss"].get<double>();
  const double norm = row(report, "padded", "train")["first_grad_norm"].get<double>();
  EXPECT_GT(norm, 0.0);
  for (const std::string layout : {"packed", "dynamic"}) {
    EXPECT_NEAR(row(report, layout, "train")["first_loss"].get<double>(), loss, 1e-5 * (1 + std::abs(loss))) << layout;
    EXPECT_NEAR(row(report, layout, "train")["first_grad_norm"].get<double>(), norm, 1e-5 * (1 + norm)) << layout;
  }
}

TEST(BenchRollouts, CommandPrintsAndWritesAWellFormedReport) {
  const fs::path json = fs::temp_directory_path() / ("bench_rollouts_" + std::to_string(::getpid()) + ".json");
  fs::remove(json);
  const std::string shape = " --device cpu --layers 2 --hidden 64 --heads 4 --kv-heads 2 --head-dim 16 --ffn 128"
                            " --vocab 256 --min-len 4 --max-len 64 --mb-tokens 128 --padded-batch 2";
  const testing::CliResult r = testing::run_cli("bench rollouts" + shape +
                                                " --sequences 8 --seed 5 --iters 1 --warmup 0 --json " + json.string());
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* want : {"rollouts benchmark:", "mix: 8 sequences", "packed/padded", "packed/long"})
    EXPECT_NE(r.output.find(want), std::string::npos) << want << "\n" << r.output;
  const size_t at = r.output.find("BENCH_ROLLOUTS ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const size_t end = r.output.find('\n', at);
  const nlohmann::json line = nlohmann::json::parse(r.output.substr(at + 15, end - at - 15));
  std::ifstream in(json);
  ASSERT_TRUE(in) << json;
  const nlohmann::json file = nlohmann::json::parse(in);
  fs::remove(json);
  EXPECT_EQ(file, line);

  EXPECT_EQ(file["model"]["layers"], 2);
  EXPECT_EQ(file["model"]["dtype"], "fp32");
  EXPECT_EQ(file["device"], "cpu");
  std::set<std::string> seen;
  for (const auto& r : file["rows"]) seen.insert(r["layout"].get<std::string>() + "/" + r["pass"].get<std::string>());
  EXPECT_EQ(seen, (std::set<std::string>{"packed/logprobs", "packed/train", "padded/logprobs", "padded/train",
                                         "long/logprobs", "long/train"}));
  check_counts(file, rollout_lengths(8, 4, 64, 5), 2, 128, true);
  EXPECT_LE(file["logprobs_max_abs_diff_packed_vs_padded"].get<double>(), 1e-5);
  EXPECT_TRUE(file["ratios"]["train"].contains("meets_bar"));

  const testing::CliResult bad = testing::run_cli("bench rollouts" + shape + " --sequences 7");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.output.find("--padded-batch 2 must divide --sequences 7"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace ringtrain::worker
