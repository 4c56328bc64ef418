// The GRPO loop (rl/grpo.h): group-normalised advantages against hand-computed values; the rollout -> Sample
// assembly (the mask on response tokens only, the sampler's logprobs at the positions Policy::score gives them);
// a GRPO run on 2 in-process context-parallel ranks against the same run on one; a resumed run against an
// uninterrupted one; bad config values named by key; and a short `ringtrain grpo` smoke run through the CLI.
#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "ringtrain/comm/agreed.h"
#include "ringtrain/comm/in_process.h"
#include "ringtrain/core/error.h"
#include "ringtrain/model/hf_config.h"
#include "ringtrain/model/params.h"
#include "ringtrain/model/policy.h"
#include "ringtrain/rl/grpo.h"
#include "ringtrain/worker/config.h"
#include "rl_test_util.h"
#include "test_util.h"

namespace ringtrain {
namespace {

namespace fs = std::filesystem;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// A path (not created) in this program's temporary folder, which goes when the program ends.
fs::path fresh_dir(const std::string& name) {
  static const testing::TempDir root("rt_grpo_test");
  const fs::path d = root.path / name;
  fs::remove_all(d);
  return d;
}

// Group keys of n rewards in groups of g adjacent ones.
std::vector<int64_t> adjacent_groups(size_t n, int64_t g) {
  std::vector<int64_t> keys(n);
  for (size_t i = 0; i < n; ++i) keys[i] = static_cast<int64_t>(i) / g;
  return keys;
}

TEST(GrpoAdvantages, HandComputedGroups) {
  // Groups of 4, sample std (squares / 3): {1,0,0,1} mean 0.5, std sqrt(1/3), so ±sqrt(3)/2; {0.5 x4} all equal;
  // {0,0,0,1} mean 0.25, squares 0.75, std 0.5, so -0.5 and 1.5.
  const std::vector<double> rewards = {1, 0, 0, 1, 0.5, 0.5, 0.5, 0.5, 0, 0, 0, 1};
  const rl::GroupAdvantages a = rl::group_advantages(rewards, adjacent_groups(12, 4), {.eps = 0.0});
  const double h = std::sqrt(3.0) / 2;
  const std::vector<double> want = {h, -h, -h, h, 0, 0, 0, 0, -0.5, -0.5, -0.5, 1.5};
  ASSERT_EQ(a.advantages.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(a.advantages[i], want[i], 1e-15) << "sample " << i;
  EXPECT_EQ(a.uniform_groups, 1);

  // The default epsilon enters the denominator: {1, 0} has std sqrt(1/2), so 0.5 / (sqrt(1/2) + 1e-6).
  const rl::GroupAdvantages e = rl::group_advantages(std::vector<double>{1, 0}, adjacent_groups(2, 2));
  EXPECT_DOUBLE_EQ(e.advantages[0], 0.5 / (std::sqrt(0.5) + rl::kAdvantageEps));
  EXPECT_DOUBLE_EQ(e.advantages[1], -0.5 / (std::sqrt(0.5) + rl::kAdvantageEps));

  // All-equal groups give exactly 0 (not a rounding residue over epsilon), whatever the value.
  const rl::GroupAdvantages u = rl::group_advantages(std::vector<double>{0.1, 0.1, 0.1, 0.7, 0.7, 0.7}, adjacent_groups(6, 3));
  for (double v : u.advantages) EXPECT_EQ(v, 0.0);
  EXPECT_EQ(u.uniform_groups, 2);

  EXPECT_NE(error_of([] { rl::group_advantages(std::vector<double>{1, 0, 1}, adjacent_groups(2, 2)); })
                .find("3 rewards but 2 group keys"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              rl::group_advantages(std::vector<double>{1, 0, 1}, adjacent_groups(3, 2), {.leave_one_out = true});
            }).find("needs groups of 2 or more; group 1 has 1 sample"),
            std::string::npos);

  // Leave-one-out, no epsilon: in {1,0,0,1} each sample's others have mean 1/3 or 2/3 and sample std sqrt(1/3), so
  // ±2/sqrt(3); in {0,0,0,1} a 0's others {0,0,1} give -1/sqrt(3), and the 1's others {0,0,0} have no spread: r - 0 =
  // 1, undivided. With groups of 2 the one other has no spread: r_i - r_j.
  const rl::GroupAdvantages loo = rl::group_advantages(rewards, adjacent_groups(12, 4), {.leave_one_out = true, .eps = 0.0});
  const double r3 = std::sqrt(3.0);
  const std::vector<double> want_loo = {2 / r3, -2 / r3, -2 / r3, 2 / r3, 0, 0, 0, 0, -1 / r3, -1 / r3, -1 / r3, 1};
  for (size_t i = 0; i < want_loo.size(); ++i) EXPECT_NEAR(loo.advantages[i], want_loo[i], 1e-14) << "sample " << i;
  const rl::GroupAdvantages pair = rl::group_advantages(std::vector<double>{0.25, 1}, adjacent_groups(2, 2), {.leave_one_out = true});
  EXPECT_EQ(pair.advantages, (std::vector<double>{-0.75, 0.75}));
  // Dr. GRPO: r - mean, undivided.
  const rl::GroupAdvantages plain = rl::group_advantages(rewards, adjacent_groups(12, 4), {.normalize = false});
  const std::vector<double> want_plain = {0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0, -0.25, -0.25, -0.25, 0.75};
  for (size_t i = 0; i < want_plain.size(); ++i) EXPECT_DOUBLE_EQ(plain.advantages[i], want_plain[i]) << i;
}

// Every option against a direct computation over each sample's others (fresh rewards, 3 groups of 2 to 9 samples
// each under arbitrary keys, members scattered over the batch), with NeMo RL's sample standard deviation.
TEST(GrpoAdvantages, AgainstTheDirectFormula) {
  std::mt19937_64 rng(testing::fresh_seed());
  for (int round = 0; round < 50; ++round) {
    std::vector<int64_t> keys;
    for (const int64_t key : {int64_t{-7}, int64_t{40}, int64_t{1} << 40})
      keys.insert(keys.end(), 2 + rng() % 8, key);
    std::shuffle(keys.begin(), keys.end(), rng);
    std::vector<double> rewards(keys.size());
    // Some groups nearly agree (values 1 apart by 1e-9 of them): the others' spread from its cancelling downdate.
    const bool near = round % 5 == 0;
    for (double& r : rewards)
      r = rng() % 3 == 0 ? 1.0
          : near         ? 1.0 + 1e-9 * std::uniform_real_distribution<double>(-1, 1)(rng)
                         : std::uniform_real_distribution<double>(-2, 2)(rng);
    for (const bool loo : {false, true})
      for (const bool normalize : {false, true}) {
        const rl::GroupAdvantages a = rl::group_advantages(rewards, keys, {normalize, loo, 1e-6});
        EXPECT_EQ(a.groups, 3);
        for (size_t i = 0; i < rewards.size(); ++i) {
          std::vector<double> others;
          for (size_t j = 0; j < rewards.size(); ++j)
            if (keys[j] == keys[i] && (!loo || j != i)) others.push_back(rewards[j]);
          double sum = 0;
          for (double r : others) sum += r;
          const double n = static_cast<double>(others.size()), mean = sum / n;
          double spread = 0;
          for (double r : others) spread += (r - mean) * (r - mean);
          const bool distinct = std::any_of(others.begin(), others.end(), [&](double r) { return r != others[0]; });
          const double sd = !distinct || n < 2 ? 0.0 : std::sqrt(spread / (n - 1));  // sample std
          double want = rewards[i] - mean;
          if (normalize && sd > 0) want /= sd + 1e-6;
          EXPECT_NEAR(a.advantages[i], want, 1e-6 * (1 + std::abs(want)))
              << "group of " << others.size() + loo << ", leave-one-out " << loo << ", normalize " << normalize;
        }
      }
  }
}

// Rollouts of identical prompts are one group (NeMo RL groups by unique prompt), wherever they lie in the step.
TEST(GrpoAdvantages, IdenticalPromptsFormOneGroup) {
  const std::vector<std::vector<int32_t>> prompts = {{5, 6}, {5, 6}, {7}, {7}, {5, 6}, {5, 6}, {5}, {5}, {5, 6, 0}};
  EXPECT_EQ(rl::prompt_groups(prompts), (std::vector<int64_t>{0, 0, 2, 2, 0, 0, 6, 6, 8}));
  EXPECT_TRUE(rl::prompt_groups(std::vector<std::vector<int32_t>>{}).empty());
  // {5, 6} twice (4 rollouts: rewards 1, 0, 0, 0) is one group of mean 0.25 and sample std 0.5, not {1, 0} and
  // {0, 0}; {7} alone; {5} uniform; {5, 6, 0} one sample, uniform.
  const std::vector<double> rewards = {1, 0, 0.5, 0, 0, 0, 0.3, 0.3, 0.9};
  const rl::GroupAdvantages a = rl::group_advantages(rewards, rl::prompt_groups(prompts), {.eps = 0.0});
  const double h = std::sqrt(0.125);  // {0.5, 0}: mean 0.25, std sqrt(0.125)
  const std::vector<double> want = {1.5, -0.5, 0.25 / h, -0.25 / h, -0.5, -0.5, 0, 0, 0};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(a.advantages[i], want[i], 1e-15) << "rollout " << i;
  EXPECT_EQ(a.groups, 4);
  EXPECT_EQ(a.uniform_groups, 2);
}

model::ModelConfig char_tiny() {
  worker::PolicyConfig p;
  p.model_name = "builtin:char-tiny";
  return worker::resolve_model_config(p);
}

TEST(GrpoRollout, MaskOnResponseAndLogprobsAtTokenPositions) {
  // Hand-made: prompt of 4, response of 3.
  model::Generation g;
  g.tokens = {8, 9, 2};
  g.logprobs = {-0.5f, -1.5f, -2.5f};
  const std::vector<int32_t> prompt = {1, 5, 6, 7};
  const worker::Sample s = rl::rollout_sample(prompt, g, 0.75);
  EXPECT_EQ(s.input_ids, (std::vector<int32_t>{1, 5, 6, 7, 8, 9, 2}));
  EXPECT_EQ(s.token_mask, (std::vector<float>{0, 0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(s.advantages, (std::vector<float>{0, 0, 0, 0, 0.75f, 0.75f, 0.75f}));
  EXPECT_EQ(s.generation_logprobs, (std::vector<float>{0, 0, 0, 0, -0.5f, -1.5f, -2.5f}));
  const worker::Sample sft = rl::sft_sample(prompt, g.tokens);
  EXPECT_EQ(sft.token_mask, s.token_mask);
  EXPECT_TRUE(sft.advantages.empty() && sft.generation_logprobs.empty());

  // Against the model: the sampler's logprobs, placed by rollout_sample, are what Policy::score gives for the same
  // tokens at those positions (the losses' convention: entry p scores token p). fp32 on both sides, summed in
  // another order: 1e-5.
  const uint64_t seed = testing::fresh_seed();
  const model::ModelConfig c = char_tiny();
  auto policy = model::make_policy(c, model::random_params(model::ParamLayout(c), seed), model::PolicyOptions{});
  model::Sampler sampler(*policy);
  model::SamplingParams sp;
  sp.max_new_tokens = 6;
  sp.seed = seed;
  const rl::CharTokenizer tok;
  const std::vector<std::vector<int32_t>> prompts = {tok.encode_prompt("123="), tok.encode_prompt("98765=")};
  const std::vector<model::Generation> gens = sampler.generate(prompts, sp);
  for (size_t b = 0; b < prompts.size(); ++b) {
    const worker::Sample r = rl::rollout_sample(prompts[b], gens[b], -0.25);
    const model::TokenScores scores = policy->score(model::TokenBatch{{r.input_ids}}, false);
    ASSERT_EQ(scores.logprobs[0].size(), r.input_ids.size());
    int counted = 0;
    for (size_t p = 0; p < r.input_ids.size(); ++p) {
      if (r.token_mask[p] == 0.f) {
        EXPECT_LT(p, prompts[b].size());
        continue;
      }
      ++counted;
      EXPECT_NEAR(r.generation_logprobs[p], scores.logprobs[0][p], 1e-5) << "prompt " << b << " position " << p;
    }
    EXPECT_EQ(counted, static_cast<int>(gens[b].tokens.size()));
  }
}

// A small GRPO config on builtin:char-tiny: 2 prompts x 4 samples, a 3-step SFT warm-up at a high learning rate so
// that step 1's rewards differ within groups, a KL penalty and the importance weights switched on.
std::string small_config(const fs::path& dir, int64_t cp, int64_t steps) {
  return "policy:\n"
         "  model_name: builtin:char-tiny\n"
         "  train_global_batch_size: 8\n"
         "  train_micro_batch_size: 4\n"
         "  logprob_batch_size: 8\n"
         "  max_total_sequence_length: 32\n"
         "  precision: float32\n"
         "  optimizer: {kwargs: {lr: 1.0e-3, weight_decay: 0.0}}\n"
         "loss_fn:\n"
         "  type: clipped_pg\n"
         "  reference_policy_kl_penalty: 0.05\n"
         "  use_importance_sampling_correction: true\n"
         "parallel: {cp: " + std::to_string(cp) + "}\n"
         "device: cpu\n"
         "grpo:\n"
         "  prompts: builtin:reverse_digits\n"
         "  num_prompts_per_step: 2\n"
         "  num_generations_per_prompt: 4\n"
         "  max_new_tokens: 7\n"
         "  sft_warmup_steps: 3\n"
         "  sft_warmup_lr: 1.0e-2\n"
         "train:\n"
         "  steps: " + std::to_string(steps) + "\n"
         "  checkpoint_dir: " + (dir / "ck").string() + "\n"
         "  checkpoint_every: 1\n"
         "  seed: 5\n";
}

std::vector<rl::GrpoStepLog> run_small(const worker::Config& c, bool resume = false) {
  std::vector<rl::GrpoStepLog> logs;
  rl::GrpoOptions o;
  o.progress = false;
  o.resume = resume;
  comm::run_ranks(static_cast<int>(c.parallel.world()), std::chrono::seconds(120), [&](comm::Communicator& world) {
    rl::GrpoOptions mine = o;
    if (world.rank() == 0) mine.on_step = [&](const rl::GrpoStepLog& l) { logs.push_back(l); };
    rl::run_grpo(c, world, mine);
  });
  return logs;
}

TEST(GrpoLoop, ContextParallelFirstStepMatchesOneRank) {
  const fs::path d1 = fresh_dir("cp1"), d2 = fresh_dir("cp2");
  const auto one = run_small(worker::parse_config(small_config(d1, 1, 2), "cp1.yaml"));
  // With metrics (written by rank 0 only; no rank may take rank 0's new files for an earlier run's).
  const auto two = run_small(
      worker::parse_config(small_config(d2, 2, 2) + "  metrics_dir: " + (d2 / "m").string() + "\n", "cp2.yaml"));
  EXPECT_TRUE(fs::is_regular_file(d2 / "m" / "metrics.jsonl"));
  ASSERT_EQ(one.size(), 2u);
  ASSERT_EQ(two.size(), 2u);
  // The warm-up leaves the weights within fp32 rounding of each other, and the sampler draws with the same uniforms:
  // the same rollouts, so the same rewards.
  EXPECT_EQ(one[0].reward_mean, two[0].reward_mean);
  // A real step: non-zero advantages give a non-zero gradient.
  EXPECT_GT(one[0].grad_norm, 1e-3);
  EXPECT_TRUE(std::isfinite(one[0].loss) && std::isfinite(two[0].loss));
  // fp32 on both; cp = 2 splits attention over the ring and merges partial softmaxes (another summation order) and
  // sums gradients across ranks: differences of a few ulps per operation, 1e-5 relative is about 100 ulps of margin
  // over the few hundred accumulations of this model.
  EXPECT_NEAR(two[0].loss, one[0].loss, 1e-5 * std::max(1.0, std::fabs(one[0].loss)));
  EXPECT_NEAR(two[0].grad_norm, one[0].grad_norm, 1e-5 * one[0].grad_norm);
}

TEST(GrpoLoop, ResumedRunRepeatsTheUninterruptedSteps) {
  const fs::path straight = fresh_dir("straight"), split = fresh_dir("split");
  const auto full = run_small(worker::parse_config(small_config(straight, 1, 3), "a.yaml"));
  const auto first = run_small(worker::parse_config(small_config(split, 1, 2), "b.yaml"));
  // The same config with more steps, resumed from the step-2 checkpoint (the warm-up is not run again).
  const auto rest = run_small(worker::parse_config(small_config(split, 1, 3), "b.yaml"), true);
  ASSERT_EQ(full.size(), 3u);
  ASSERT_EQ(first.size(), 2u);
  ASSERT_EQ(rest.size(), 1u);
  EXPECT_EQ(rest[0].step, 3);
  // Weights and optimizer state restore bitwise, prompts and samples are counter-based: step 3 is the same step.
  EXPECT_EQ(rest[0].reward_mean, full[2].reward_mean);
  EXPECT_EQ(rest[0].loss, full[2].loss);
  EXPECT_EQ(rest[0].grad_norm, full[2].grad_norm);
  // Without --resume an existing checkpoint is not overwritten.
  EXPECT_NE(error_of([&] { run_small(worker::parse_config(small_config(split, 1, 3), "b.yaml")); }).find("--resume"),
            std::string::npos);
  const auto resume_error = [&](const std::string& override_) {
    return error_of([&] { run_small(worker::parse_config(small_config(split, 1, 3), "b.yaml", {override_}), true); });
  };
  // Another seed would draw other samples from step 3 on: resuming with it is refused, naming both orders.
  const std::string reseeded = resume_error("train.seed=6");
  EXPECT_NE(reseeded.find("its rollout order is 'grpo seed 5, prompts builtin:reverse_digits, 2 prompts x 4 samples "
                          "per step, after 3 SFT warm-up steps', this run's 'grpo seed 6"),
            std::string::npos)
      << reseeded;
  // Another warm-up would number the records before GRPO's otherwise and change the reference policy: refused.
  const std::string rewarmed = resume_error("grpo.sft_warmup_steps=1");
  EXPECT_NE(rewarmed.find("after 3 SFT warm-up steps', this run's 'grpo seed 5, prompts builtin:reverse_digits, 2 "
                          "prompts x 4 samples per step, after 1 SFT warm-up steps'"),
            std::string::npos)
      << rewarmed;
  // Another starting model: the warm-up's weights stand in for it, but its config is checked against the one named.
  const std::string remodelled = resume_error("policy.model_name=builtin:tiny");
  EXPECT_NE(remodelled.find((split / "ck" / "sft_warmup" / "config.json").string() +
                            ": the checkpoint is of another model"),
            std::string::npos)
      << remodelled;
  // Resuming where there is no checkpoint yet starts the run: the same steps as a plain start.
  const auto started = run_small(worker::parse_config(small_config(fresh_dir("none"), 1, 1), "c.yaml"), true);
  ASSERT_EQ(started.size(), 1u);
  EXPECT_EQ(started[0].loss, full[0].loss);
}

// A prompt file is known by its records, not by its path: the same records under another name resume, other records
// at the same path are refused. Every record's length is checked before the run starts, naming its line.
TEST(GrpoLoop, APromptFileIsKnownByItsRecordsAndCheckedWhole) {
  const fs::path d = fresh_dir("prompt_file");
  fs::create_directories(d);
  const auto write = [&](const std::string& name, const std::vector<std::pair<std::string, std::string>>& rows) {
    std::ofstream out(d / name);
    for (const auto& [prompt, answer] : rows)
      out << R"({"prompt": ")" << prompt << R"(", "answer": ")" << answer << "\"}\n";
    return (d / name).string();
  };
  const std::vector<std::pair<std::string, std::string>> rows = {{"123", "321"}, {"4567", "7654"}, {"89", "98"}};
  const std::string file = write("p.jsonl", rows);
  const auto config = [&](const std::string& prompts, int64_t steps) {
    return worker::parse_config(small_config(d, 1, steps), "p.yaml", {"grpo.prompts=" + prompts});
  };
  ASSERT_EQ(run_small(config(file, 1)).size(), 1u);
  fs::copy_file(d / "p.jsonl", d / "same.jsonl");
  const auto resumed = run_small(config((d / "same.jsonl").string(), 2), true);
  ASSERT_EQ(resumed.size(), 1u);
  EXPECT_EQ(resumed[0].step, 2);

  std::vector<std::pair<std::string, std::string>> changed = rows;
  changed[1] = {"4568", "8654"};
  write("p.jsonl", changed);  // as many records, one digit apart
  const std::string refused = error_of([&] { run_small(config(file, 3), true); });
  EXPECT_NE(refused.find("prompts a file of 3 records ("), std::string::npos) << refused;
  EXPECT_NE(refused.find("grpo.prompts (the same records)"), std::string::npos) << refused;

  // The fourth record's prompt leaves no room for max_new_tokens, a later answer none for the warm-up: refused at
  // the start, before any file of the run is made, naming the line.
  std::vector<std::pair<std::string, std::string>> long_prompt = rows;
  long_prompt.push_back({std::string(30, '1'), "1"});
  const std::string fresh = (d / "fresh_ck").string();
  const auto start_error = [&](const std::string& prompts) {
    return error_of([&] {
      run_small(worker::parse_config(small_config(d, 1, 1), "p.yaml",
                                     {"grpo.prompts=" + prompts, "train.checkpoint_dir=" + fresh}));
    });
  };
  const std::string too_long = start_error(write("long_prompt.jsonl", long_prompt));
  EXPECT_NE(too_long.find("long_prompt.jsonl:4: grpo.max_new_tokens = 7: prompt '111"), std::string::npos) << too_long;
  std::vector<std::pair<std::string, std::string>> long_answer = rows;
  long_answer[1].second = std::string(40, '7');
  const std::string answer_too_long = start_error(write("long_answer.jsonl", long_answer));
  EXPECT_NE(answer_too_long.find("long_answer.jsonl:2: SFT warm-up: prompt '4567'"), std::string::npos)
      << answer_too_long;
  EXPECT_FALSE(fs::exists(fresh));

  // Validation: a prompt file has no held-out part, so it needs grpo.val_prompts, whose records are checked whole at
  // the start too; with one, the run validates on its first max_val_samples records.
  const auto validation_error = [&](const std::vector<std::string>& more) {
    std::vector<std::string> o = {"grpo.prompts=" + file, "train.checkpoint_dir=" + fresh, "grpo.val_period=1"};
    o.insert(o.end(), more.begin(), more.end());
    return error_of([&] { run_small(worker::parse_config(small_config(d, 1, 1), "p.yaml", o)); });
  };
  EXPECT_NE(validation_error({}).find("grpo.val_prompts is required to validate a run on a prompt file (grpo.prompts = " +
                                      file + ")"),
            std::string::npos)
      << validation_error({});
  const std::string val_long = validation_error({"grpo.val_prompts=" + write("val_long.jsonl", long_prompt)});
  EXPECT_NE(val_long.find("val_long.jsonl:4: validation: grpo.max_new_tokens = 7: prompt '111"), std::string::npos)
      << val_long;
  const std::string val_empty = validation_error({"grpo.val_prompts=" + write("val_empty.jsonl", {})});
  EXPECT_NE(val_empty.find("prompt file " + (d / "val_empty.jsonl").string() + ": no records"),
            std::string::npos)
      << val_empty;
  EXPECT_FALSE(fs::exists(fresh));
  const auto validated = run_small(worker::parse_config(
      small_config(d, 1, 1), "p.yaml",
      {"grpo.prompts=" + file, "train.checkpoint_dir=" + fresh, "grpo.val_period=1",
       "grpo.val_prompts=" + write("val.jsonl", long_prompt), "grpo.max_val_samples=3"}));  // the long 4th left out
  ASSERT_EQ(validated.size(), 1u);
  EXPECT_TRUE(validated[0].validation.has_value());
  // Named but not read when the run does not validate: a note says so (the CLI shows the lead's stderr).
  const fs::path quiet = d / "quiet.yaml";
  std::ofstream(quiet) << small_config(d / "quiet", 1, 1);
  const testing::CliResult noted = testing::run_cli("grpo --config " + quiet.string() + " --no-progress "
                                                    "grpo.val_prompts=missing.jsonl 2>&1");
  EXPECT_EQ(noted.code, 0) << noted.output;
  EXPECT_NE(noted.output.find("note: grpo.val_prompts = missing.jsonl is not read: the run does not validate"),
            std::string::npos)
      << noted.output;
}

// A stop asked on one rank while it samples: every rank stops at the same point (the sampling rank at its next token,
// the other after its rollouts, where they agree), the finished step 1 is saved although train.checkpoint_every = 2
// (train.checkpoint_on_stop), step 2 leaves nothing, and --resume repeats the uninterrupted run's steps 2 and 3
// bitwise.
TEST(GrpoLoop, AStopOnOneRankWhileSamplingStopsEveryRankAndResumeRepeatsTheSteps) {
  const fs::path straight = fresh_dir("nostop"), stopped = fresh_dir("stopped");
  const auto full = run_small(worker::parse_config(small_config(straight, 2, 3), "a.yaml"));
  ASSERT_EQ(full.size(), 3u);

  const worker::Config c = worker::parse_config(small_config(stopped, 2, 3), "b.yaml", {"train.checkpoint_every=2"});
  std::vector<rl::GrpoStepLog> before;
  bool interrupted = false;
  try {
    comm::run_ranks(2, std::chrono::seconds(120), [&](comm::Communicator& world) {
      StopRequest stop;  // each rank its own: the other rank learns of the stop only through the agreement
      rl::GrpoOptions mine;
      mine.progress = false;
      mine.stop = &stop;
      mine.on_step = [&](const rl::GrpoStepLog& l) {
        if (world.rank() == 0) before.push_back(l);
        if (world.rank() == 1) stop.request();  // step 2's sampling sees it before its first prefill
      };
      rl::run_grpo(c, world, mine);
    });
  } catch (const comm::Interrupted& e) {  // the ranks' own exception, not a failure wrapped with a rank's name
    interrupted = true;
    EXPECT_NE(std::string(e.what()).find("GRPO step 2 was interrupted"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(interrupted);
  ASSERT_EQ(before.size(), 1u);
  EXPECT_EQ(before[0].loss, full[0].loss);
  EXPECT_TRUE(fs::is_regular_file(stopped / "ck" / "step_1" / "trainer_state.json"));
  EXPECT_FALSE(fs::exists(stopped / "ck" / "step_2"));

  const auto rest = run_small(c, true);
  ASSERT_EQ(rest.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(rest[i].step, full[i + 1].step);
    EXPECT_EQ(rest[i].reward_mean, full[i + 1].reward_mean);
    EXPECT_EQ(rest[i].loss, full[i + 1].loss);
    EXPECT_EQ(rest[i].grad_norm, full[i + 1].grad_norm);
  }
}

// Greedy responses of the policy in `dir` (a checkpoint) to `examples`, scored by the partial and exact rewards:
// what a validation of those weights must report.
std::pair<double, double> greedy_rewards(const fs::path& dir, const std::vector<rl::Example>& examples) {
  const model::ModelConfig c = model::load_config(dir);
  auto policy = model::make_policy(c, model::load_checkpoint_params(dir, c), model::PolicyOptions{});
  model::Sampler sampler(*policy);
  model::SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = 7;
  greedy.stop_tokens = {rl::CharTokenizer::kEos};
  const rl::CharTokenizer tok;
  std::vector<std::vector<int32_t>> prompts;
  for (const rl::Example& e : examples) prompts.push_back(tok.encode_prompt(e.prompt));
  return rl::testing::mean_rewards(examples, sampler.generate(prompts, greedy));
}

// Validation before GRPO and every 2 steps and after the last: its own record at the warm-up's last step number,
// then val/* in the records of steps 2 and 3, each equal to greedy decoding of the held-out prompts (the built-in
// task's examples at rl::kValidationIndexBase on) from the weights of that moment; the same on 2 context-parallel
// ranks; the rollouts and losses unchanged by it.
TEST(GrpoLoop, ValidationDecodesTheHeldOutPromptsGreedily) {
  const fs::path d = fresh_dir("validation"), plain = fresh_dir("validation_off");
  const auto config = [](const fs::path& dir, int64_t cp, const std::vector<std::string>& extra) {
    std::vector<std::string> o = {"train.metrics_dir=" + (dir / "m").string()};
    o.insert(o.end(), extra.begin(), extra.end());
    return worker::parse_config(small_config(dir, cp, 3), "v.yaml", o);
  };
  const std::vector<std::string> validate = {"grpo.val_at_start=true", "grpo.val_period=2", "grpo.max_val_samples=11"};
  const auto with = run_small(config(d, 1, validate));
  const auto without = run_small(config(plain, 1, {}));
  ASSERT_EQ(with.size(), 3u);
  ASSERT_EQ(without.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(with[i].loss, without[i].loss) << "step " << i + 1;
    EXPECT_EQ(with[i].reward_mean, without[i].reward_mean) << "step " << i + 1;
    EXPECT_FALSE(without[i].validation.has_value());
  }
  EXPECT_FALSE(with[0].validation.has_value());
  ASSERT_TRUE(with[1].validation.has_value() && with[2].validation.has_value());

  std::vector<rl::Example> held_out;
  const rl::ReverseDigitsTask task(5);  // small_config's train.seed
  for (uint64_t i = 0; i < 11; ++i) held_out.push_back(task.example(rl::kValidationIndexBase + i));
  std::map<int64_t, nlohmann::json> val;  // step -> record with val/* keys
  std::ifstream in(d / "m" / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json row = nlohmann::json::parse(line);
    if (row.contains("val/reward")) val[row["step"].get<int64_t>()] = row;
  }
  ASSERT_EQ(val.size(), 3u);
  ASSERT_TRUE(val.count(3) && val.count(5) && val.count(6));  // 3 warm-up steps, then GRPO steps 2 and 3
  EXPECT_FALSE(val[3].contains("loss"));  // the start's record holds the validation only
  for (const auto& [step, dir] : {std::pair{int64_t{3}, d / "ck" / "sft_warmup"}, std::pair{int64_t{5}, d / "ck" / "step_2"},
                                  std::pair{int64_t{6}, d / "ck" / "step_3"}}) {
    const auto [partial, exact] = greedy_rewards(dir, held_out);
    EXPECT_DOUBLE_EQ(val[step]["val/reward"].get<double>(), partial) << "record " << step;
    EXPECT_DOUBLE_EQ(val[step]["val/exact_match"].get<double>(), exact) << "record " << step;
    EXPECT_GT(val[step]["val/response_length"].get<double>(), 0);
  }
  EXPECT_DOUBLE_EQ(with[2].validation->first, val[6]["val/reward"].get<double>());
  // The weights move between the validations: not the same responses throughout (the warm-up's lr is high).
  EXPECT_NE(val[3]["val/reward"], val[6]["val/reward"]);

  // Two context-parallel ranks decode the same responses (fp32 weights within rounding; greedy choices the same).
  const auto two = run_small(config(fresh_dir("validation_cp2"), 2, validate));
  ASSERT_EQ(two.size(), 3u);
  ASSERT_TRUE(two[2].validation.has_value());
  EXPECT_EQ(two[2].validation->first, with[2].validation->first);
}

TEST(GrpoConfig, BadValuesNamedByKey) {
  const std::string base = small_config(fresh_dir("cfg"), 1, 2);
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"grpo.num_generations_per_prompt=1"}, "grpo.num_generations_per_prompt = 1: out of range"},
      {{"grpo.top_p=0"}, "grpo.top_p = 0: out of range"},
      {{"grpo.temperature=-1"}, "grpo.temperature = -1: out of range"},
      {{"grpo.max_new_tokens=0"}, "grpo.max_new_tokens = 0: out of range"},
      {{"grpo.reward=fuzzy"}, "grpo.reward = 'fuzzy': expected one of partial, exact"},
      {{"grpo.sft_warmup_lr=.nan"}, "grpo.sft_warmup_lr = .nan: not a finite number"},
      {{"grpo.num_prompts_per_step=3"}, "grpo.num_prompts_per_step (3) x grpo.num_generations_per_prompt (4) = 12 "
                                        "must equal policy.train_global_batch_size = 8"},
      {{"train.steps=0"}, "train.steps = 0: a GRPO run needs"},
      {{"grpo.temprature=1"}, "unknown key 'grpo.temprature' (did you mean 'grpo.temperature'"},
      {{"grpo.val_period=-1"}, "grpo.val_period = -1: out of range"},
      {{"grpo.max_val_samples=0"}, "grpo.max_val_samples = 0: out of range"},
      {{"grpo.val_at_start=sometimes"}, "grpo.val_at_start = 'sometimes'"},
  };
  for (const auto& [overrides, want] : cases) {
    const std::string got = error_of([&] { worker::parse_config(base, "g.yaml", overrides); });
    EXPECT_NE(got.find(want), std::string::npos) << "overrides " << overrides[0] << "\n got: " << got;
  }
  // Checked when the run starts (they need the prompts or the model).
  const auto start_error = [&](const std::vector<std::string>& overrides) {
    const worker::Config c = worker::parse_config(base, "g.yaml", overrides);
    return error_of([&] { run_small(c); });
  };
  EXPECT_NE(start_error({"loss_fn.type=nll"}).find("loss_fn.type = nll: a GRPO run trains with clipped_pg"),
            std::string::npos);
  // Beside train.data the section is checked when the GRPO run starts (`ringtrain train` would leave it unused).
  EXPECT_NE(start_error({"train.data=rows.jsonl", "grpo.num_prompts_per_step=3"})
                .find("grpo.num_prompts_per_step (3) x grpo.num_generations_per_prompt (4) = 12 must equal"),
            std::string::npos);
  EXPECT_NE(start_error({"grpo.prompts=builtin:sort"}).find("grpo.prompts = builtin:sort: unknown built-in task"),
            std::string::npos);
  EXPECT_NE(start_error({"train.checkpoint_dir=", "train.checkpoint_every=0"}).find(
                "grpo.sft_warmup_steps needs train.checkpoint_dir"),
            std::string::npos);
  EXPECT_NE(start_error({"grpo.max_new_tokens=30"}).find("grpo.max_new_tokens = 30: prompt '"),
            std::string::npos);
  // The built-in task's every prompt, not only the first step's: its longest (BOS, 5 digits, '=') + 25 fits in 32,
  // + 26 is refused before any step, whatever digits the seed draws first.
  const auto config_error = [&](const std::string& max_new_tokens) {
    const worker::Config c = worker::parse_config(base, "g.yaml", {"grpo.max_new_tokens=" + max_new_tokens});
    return error_of([&] { rl::check_grpo_config(c, nullptr); });
  };
  EXPECT_EQ(config_error("25"), "(no error)");
  EXPECT_NE(config_error("26").find("the built-in task's longest prompt (5 digits): grpo.max_new_tokens = 26: prompt "
                                    "'99999=' (7 tokens) + 26 response tokens exceeds"),
            std::string::npos)
      << config_error("26");
  // Without a grpo section a config still needs its training data.
  EXPECT_NE(error_of([&] { worker::parse_config(base, "g.yaml", {"grpo.prompts="}); }).find("train.data is required"),
            std::string::npos);
}

TEST(GrpoConfig, AutoDeviceAndPrecision) {
  const worker::Config c = worker::parse_config(
      "policy: {model_name: builtin:tiny}\ntrain: {data: x.jsonl}\n", "auto.yaml");
  const bool gpu = cuda_unavailable_reason().empty() && hopper_unavailable_reason(Device::cuda(0)).empty();
  EXPECT_EQ(c.device, gpu ? Device::cuda(0) : Device::cpu());
  EXPECT_EQ(c.policy.precision, gpu ? worker::Precision::BFloat16 : worker::Precision::Float32);
  const worker::Config named = worker::parse_config(
      "policy: {model_name: builtin:tiny, precision: auto}\ndevice: auto\ntrain: {data: x.jsonl}\n", "auto.yaml");
  EXPECT_EQ(named, c);
  EXPECT_EQ(worker::parse_config(worker::to_yaml(c), "round.yaml"), c);
}

// The command end to end on a few steps: exit 0, the summary printed, every metric of every step finite. Not a
// test of correctness (the tests above are); a check that the command, metrics file and curve fit together.
TEST(GrpoCli, SmokeRunWritesFiniteMetrics) {
  const fs::path d = fresh_dir("cli");
  fs::create_directories(d);
  const fs::path cfg = d / "g.yaml";
  std::ofstream(cfg) << small_config(d, 1, 3);
  // The metrics (and the curves drawn from them) in the checkpoint folder, beside the checkpoints: as accepted when
  // resumed as when started.
  const fs::path m = d / "ck" / "metrics";
  const testing::CliResult r =
      testing::run_cli("grpo --config " + cfg.string() + " train.metrics_dir=" + m.string() + " 2>&1");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("exact match:"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::is_regular_file(m / "reward.svg"));
  std::ifstream in(m / "metrics.jsonl");
  std::string line;
  int warmup = 0, grpo = 0;
  const std::set<std::string> grpo_keys = {
      "reward/mean", "reward/std", "reward/exact_match", "reward/uniform_group_fraction", "response/length_mean",
      "response/length_max", "kl_to_reference", "loss", "grad_norm", "lr", "clip_fraction", "approx_kl", "entropy",
      "ref_kl", "tokens_per_second", "time/generate", "time/logprobs", "time/train"};
  while (std::getline(in, line)) {
    const nlohmann::json row = nlohmann::json::parse(line);
    std::set<std::string> keys;
    for (const auto& [k, v] : row.items()) {
      keys.insert(k);
      ASSERT_TRUE(v.is_number()) << k << " in " << line;  // a non-finite value is written as null
    }
    if (keys.count("warmup/loss")) {
      ++warmup;
      EXPECT_EQ(row["step"], warmup);
    } else {
      ++grpo;
      EXPECT_EQ(row["step"], 3 + grpo);  // after the 3 warm-up steps
      for (const std::string& k : grpo_keys) EXPECT_TRUE(keys.count(k)) << k << " missing in " << line;
    }
  }
  EXPECT_EQ(warmup, 3);
  EXPECT_EQ(grpo, 3);

  // A second run in the same folders: refused without --resume, naming the metrics file. Resumed from the step-2
  // checkpoint, the records of step 3 (written as step 6) are dropped and written again: every step once.
  const std::string again = "grpo --config " + cfg.string() + " train.metrics_dir=" + m.string();
  const testing::CliResult fresh = testing::run_cli(again + " 2>&1");
  EXPECT_NE(fresh.code, 0);
  EXPECT_NE(fresh.output.find((m / "metrics.jsonl").string() + " holds the metrics of an earlier run"),
            std::string::npos) << fresh.output;
  fs::remove_all(d / "ck" / "step_3");
  const testing::CliResult resumed = testing::run_cli(again + " --resume 2>&1");
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  std::vector<int64_t> steps;
  std::ifstream reread(m / "metrics.jsonl");
  while (std::getline(reread, line)) steps.push_back(nlohmann::json::parse(line).at("step").get<int64_t>());
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  // Curves inside a checkpoint's folder are refused (a save replaces it whole).
  const testing::CliResult in_checkpoint =
      testing::run_cli(again + " --resume --plot " + (d / "ck" / "step_2" / "r.svg").string() + " 2>&1");
  EXPECT_NE(in_checkpoint.output.find("a checkpoint's name in train.checkpoint_dir"), std::string::npos)
      << in_checkpoint.output;
  // A name that only starts like one is beside them: the run (here with no step left) draws its curves there.
  const testing::CliResult beside =
      testing::run_cli(again + " --resume --plot " + (d / "ck" / "step_curves.svg").string() + " 2>&1");
  EXPECT_EQ(beside.code, 0) << beside.output;
  EXPECT_TRUE(fs::is_regular_file(d / "ck" / "step_curves.svg"));

  // A train.data beside the prompts is named as unused (here before the finished run's checkpoint refuses a fresh one).
  const testing::CliResult with_data = testing::run_cli(again + " --overwrite-metrics train.data=rows.jsonl 2>&1");
  EXPECT_NE(with_data.output.find("exists: pass --resume"), std::string::npos) << with_data.output;
  EXPECT_NE(with_data.output.find("ringtrain grpo: note: train.data = rows.jsonl is not used"), std::string::npos)
      << with_data.output;
}

}  // namespace
}  // namespace ringtrain
