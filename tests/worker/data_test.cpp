// Training data: JSONL rows read into samples (checked against hand-built expectations), every kind of bad row an
// error with FILE:LINE and the field, the safetensors batch form read back equal, and the batch schedule (every
// unit exactly once per epoch, dp shares disjoint, reproducible from the seed, different across epochs).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "ringtrain/core/error.h"
#include "ringtrain/model/safetensors.h"
#include "ringtrain/worker/data.h"
#include "test_util.h"

namespace ringtrain::worker {
namespace {

namespace fs = std::filesystem;

DataSpec spec(LossType loss = LossType::Nll) {
  DataSpec s;
  s.vocab = 100;
  s.max_length = 8;
  s.loss = loss;
  s.need_advantages = loss == LossType::ClippedPg;
  return s;
}

std::string error_of(const std::string& text, const DataSpec& s = spec()) {
  try {
    parse_jsonl(text, "d.jsonl", s);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error for: " << text.substr(0, 200);
  return "";
}

TEST(WorkerData, ReadsRowsWithDefaultsAndPerSampleAdvantages) {
  const Dataset d = parse_jsonl(
      "{\"input_ids\": [1, 2, 3], \"advantages\": -0.5, \"token_mask\": [0, true, 1], \"prev_logprobs\": [0, -1.5, "
      "-2]}\n"
      "{\"input_ids\": [99], \"advantages\": [2.25], \"sample_mask\": 0, \"prev_logprobs\": [0], \"token_mask\": [1]}\r\n",
      "d.jsonl", spec(LossType::ClippedPg));
  ASSERT_EQ(d.samples.size(), 2u);
  EXPECT_FALSE(d.pairs);
  EXPECT_EQ(d.tokens(), 4);
  const Sample& a = d.samples[0];
  EXPECT_EQ(a.input_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(a.token_mask, (std::vector<float>{0, 1, 1}));
  EXPECT_EQ(a.advantages, (std::vector<float>{-0.5f, -0.5f, -0.5f}));
  EXPECT_EQ(a.prev_logprobs, (std::vector<float>{0, -1.5f, -2}));
  EXPECT_EQ(a.sample_mask, 1.0f);
  EXPECT_TRUE(a.reference_logprobs.empty());
  const Sample& b = d.samples[1];
  EXPECT_EQ(b.input_ids, (std::vector<int32_t>{99}));
  EXPECT_EQ(b.token_mask, (std::vector<float>{1}));
  EXPECT_EQ(b.advantages, (std::vector<float>{2.25f}));
  EXPECT_EQ(b.sample_mask, 0.0f);
  // Rows without a token_mask (all of them) have ones.
  const Dataset plain = parse_jsonl("{\"input_ids\": [4, 5]}\n", "d.jsonl", spec(LossType::Nll));
  EXPECT_EQ(plain.samples[0].token_mask, (std::vector<float>{1, 1}));
}

TEST(WorkerData, DpoPairsBecomeChosenThenRejected) {
  const Dataset d = parse_jsonl(
      "{\"chosen_input_ids\": [5, 6, 7], \"rejected_input_ids\": [5, 8], \"chosen_token_mask\": [0, 1, 1], "
      "\"rejected_token_mask\": [0, 1]}\n"
      "{\"chosen_input_ids\": [1], \"rejected_input_ids\": [2, 3, 4, 5], \"chosen_token_mask\": [1], "
      "\"rejected_token_mask\": [1, 1, 1, 0]}\n",
      "d.jsonl", spec(LossType::Dpo));
  ASSERT_EQ(d.samples.size(), 4u);
  EXPECT_TRUE(d.pairs);
  EXPECT_EQ(d.units(), 2);
  EXPECT_EQ(d.samples[0].input_ids, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(d.samples[1].input_ids, (std::vector<int32_t>{5, 8}));
  EXPECT_EQ(d.samples[1].token_mask, (std::vector<float>{0, 1}));
  EXPECT_EQ(d.samples[3].token_mask, (std::vector<float>{1, 1, 1, 0}));
  EXPECT_NE(
      error_of("{\"chosen_input_ids\": [1]}\n", spec(LossType::Dpo)).find("d.jsonl:1: missing rejected_input_ids"),
      std::string::npos);
  EXPECT_NE(error_of("{\"input_ids\": [1]}\n", spec(LossType::Dpo)).find("unknown field 'input_ids'"),
            std::string::npos);
  const std::string unmasked = error_of(
      "{\"chosen_input_ids\": [1], \"rejected_input_ids\": [2], \"rejected_token_mask\": [1]}\n"
      "{\"chosen_input_ids\": [1], \"rejected_input_ids\": [2]}\n",
      spec(LossType::Dpo));
  EXPECT_NE(unmasked.find("d.jsonl:2: rejected_token_mask missing"), std::string::npos) << unmasked;
}

TEST(WorkerData, BadRowsNameFileLineAndField) {
  struct Case {
    std::string text, want;
  };
  const std::string ok = "{\"input_ids\": [1, 2]}\n";
  const std::vector<Case> cases = {
      {ok + "{\"input_ids\": [1, 100]}\n", "d.jsonl:2: input_ids[1] = 100: not a token id in [0, 100)"},
      {ok + "{\"input_ids\": [-1]}\n", "d.jsonl:2: input_ids[0] = -1"},
      {ok + "{\"input_ids\": [1.5]}\n", "input_ids[0] = 1.5"},
      {ok + "{\"input_ids\": [\"3\"]}\n", "input_ids[0] = \"3\""},
      {ok + "{\"input_ids\": [18446744073709551615]}\n", "input_ids[0] = 18446744073709551615"},
      {ok + "{\"input_ids\": []}\n", "input_ids: 0 tokens"},
      {ok + "{\"input_ids\": [1,2,3,4,5,6,7,8,9]}\n", "9 tokens (expected 1 to policy.max_total_sequence_length = 8)"},
      {ok + "{\"input_ids\": [1, 2], \"token_mask\": [1]}\n", "d.jsonl:2: token_mask has 1 entries, the sequence 2"},
      {ok + "{\"input_ids\": [1, 2], \"token_mask\": [1, 2]}\n", "token_mask[1] = 2: expected 0 or 1"},
      {ok + "{\"input_ids\": [1, 2], \"sample_mask\": 0.5}\n", "sample_mask = 0.5: expected 0 or 1"},
      {ok + "{\"input_ids\": [1, 2], \"token_mask\": 1}\n", "token_mask: expected a list"},
      {ok + "{\"input_ids\": [1, 2], \"reference_logprobs\": [0, 1e39]}\n", "d.jsonl:2: reference_logprobs[1]"},
      {ok + "{\"input_ids\": [1, 2], \"prev_logprobs\": [0, null]}\n", "prev_logprobs[1] = null: expected a number"},
      {ok + "{\"input_ids\": [1, 2], \"generation_logprobs\": [0, 0.5]}\n",
       "d.jsonl:2: generation_logprobs[1] = 0.5: a log-probability is at most 0"},
      {ok + "{\"input_ids\": [1, 2], \"advantage\": 1}\n", "unknown field 'advantage'"},
      {ok + "{\"input_ids\": [1, 2]\n", "d.jsonl:2: invalid JSON"},
      {ok + "[1, 2]\n", "d.jsonl:2: expected a JSON object"},
      {ok + "\n" + ok, "d.jsonl:2: blank line"},
      {ok + "  \t\n", "d.jsonl:2: blank line"},
      {ok + "{\"input_ids\": [[1]]}\n", "d.jsonl:2: JSON nested deeper"},
      {ok + "{\"input_ids\": " + std::string(100000, '[') + "}\n", "d.jsonl:2: JSON nested deeper than 2 levels"},
      {ok + "{\"a\": {\"b\": {\"c\": 1}}}\n", "nested deeper"},
      {ok + "{\"token_mask\": [1]}\n", "d.jsonl:2: missing input_ids"},
      {ok + "{\"input_ids\": [1, 2], \"input_ids\": [3, 4]}\n", "d.jsonl:2: key \"input_ids\" given twice"},
      {"{\"input_ids\": [1, 2], \"prev_logprobs\": [0, -1]}\n" + ok, "d.jsonl:2: prev_logprobs missing"},
      // A left-out token_mask would default to ones: it too is given in every row or in none.
      {"{\"input_ids\": [1, 2], \"token_mask\": [0, 1]}\n" + ok,
       "d.jsonl:2: token_mask missing (d.jsonl:1 has it; every row must agree)"},
      {ok + "{\"input_ids\": [1, 2], \"token_mask\": [0, 1]}\n", "d.jsonl:2: token_mask present (d.jsonl:1 does not"},
      {"", "d.jsonl: no samples"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.want);
    const std::string e = error_of(c.text);
    EXPECT_NE(e.find(c.want), std::string::npos) << e;
  }
  EXPECT_NE(error_of("{\"input_ids\": [1, 2]}\n", spec(LossType::ClippedPg)).find("advantages are required"),
            std::string::npos);
  DataSpec is = spec(LossType::ClippedPg);
  is.need_generation_logprobs = true;
  EXPECT_NE(error_of("{\"input_ids\": [1, 2], \"advantages\": 1}\n", is).find("generation_logprobs are required"),
            std::string::npos);
}

// Random samples with every optional field, read back from the safetensors batch form.
TEST(WorkerData, SafetensorsBatchRoundTrip) {
  std::mt19937_64 rng(testing::fresh_seed());
  Dataset d;
  for (int b = 0; b < 7; ++b) {
    Sample s;
    const int len = 1 + static_cast<int>(rng() % 8);
    for (int p = 0; p < len; ++p) {
      s.input_ids.push_back(static_cast<int32_t>(rng() % 100));
      s.token_mask.push_back(static_cast<float>(rng() % 2));
      s.advantages.push_back(std::normal_distribution<float>()(rng));
      s.generation_logprobs.push_back(-std::exponential_distribution<float>()(rng));
      s.prev_logprobs.push_back(-std::exponential_distribution<float>()(rng));
      s.reference_logprobs.push_back(-std::exponential_distribution<float>()(rng));
    }
    s.sample_mask = static_cast<float>(rng() % 2);
    d.samples.push_back(s);
  }
  const testing::TempDir tmp("rt_data_test");
  const fs::path& dir = tmp.path;
  write_batch_safetensors(dir / "batch.safetensors", d);
  const Dataset back = load_dataset(dir / "batch.safetensors", spec(LossType::ClippedPg));
  EXPECT_TRUE(back.samples == d.samples);
  // A token past the vocabulary and a length past the row are named.
  model::TensorMap t = model::read_safetensors(dir / "batch.safetensors");
  const int32_t bad = 100;
  std::memcpy(t["input_ids"].bytes.data(), &bad, 4);
  model::write_safetensors(dir / "bad.safetensors", t);
  try {
    load_dataset(dir / "bad.safetensors", spec());
    ADD_FAILURE() << "token 100 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("input_ids[0, 0] = 100"), std::string::npos) << e.what();
  }
  t = model::read_safetensors(dir / "batch.safetensors");
  const int32_t long_len = 9;
  std::memcpy(t["lengths"].bytes.data() + 4, &long_len, 4);
  model::write_safetensors(dir / "bad.safetensors", t);
  EXPECT_THROW(load_dataset(dir / "bad.safetensors", spec()), Error);
  t = model::read_safetensors(dir / "batch.safetensors");
  t["extra"] = t["lengths"];
  model::write_safetensors(dir / "bad.safetensors", t);
  EXPECT_THROW(load_dataset(dir / "bad.safetensors", spec()), Error);
  // A positive log-probability is named with its place.
  t = model::read_safetensors(dir / "batch.safetensors");
  const float positive = 0.25f;
  std::memcpy(t["prev_logprobs"].bytes.data(), &positive, 4);
  model::write_safetensors(dir / "bad.safetensors", t);
  try {
    load_dataset(dir / "bad.safetensors", spec(LossType::ClippedPg));
    ADD_FAILURE() << "a positive logprob accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("prev_logprobs[0, 0] = 0.25: a log-probability is at most 0"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(load_dataset(dir, spec()), Error);

  // DPO rows alternate chosen and rejected: a pair whose sample masks disagree is named at load, by its rows.
  Dataset pairs;
  for (size_t b = 0; b < 6; ++b) {
    Sample x = d.samples[b];
    x.advantages.clear(), x.generation_logprobs.clear(), x.prev_logprobs.clear(), x.reference_logprobs.clear();
    x.token_mask.assign(x.input_ids.size(), 1.0f);
    x.sample_mask = b == 3 ? 0.0f : 1.0f;
    pairs.samples.push_back(x);
  }
  write_batch_safetensors(dir / "pairs.safetensors", pairs);
  try {
    load_dataset(dir / "pairs.safetensors", spec(LossType::Dpo));
    ADD_FAILURE() << "a half-masked DPO pair accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pairs.safetensors: sample_mask[2] = 1 but sample_mask[3] = 0: rows 2 and 3 "
                                         "are one DPO pair"),
              std::string::npos)
        << e.what();
  }
  pairs.samples[2].sample_mask = 0.0f;
  write_batch_safetensors(dir / "pairs.safetensors", pairs);
  EXPECT_EQ(load_dataset(dir / "pairs.safetensors", spec(LossType::Dpo)).units(), 3);
}

TEST(WorkerData, BatchScheduleCoversEveryUnitOncePerEpoch) {
  const uint64_t seed = testing::fresh_seed();
  const int64_t units = 23, gbs = 6, dp = 3;
  const BatchSchedule s(units, gbs, seed);
  ASSERT_EQ(s.steps_per_epoch(), 3);
  std::vector<std::vector<int64_t>> epochs(2);
  for (int64_t step = 0; step < 6; ++step) {
    std::vector<int64_t> all;
    for (int64_t r = 0; r < dp; ++r) {
      const std::vector<int64_t> share = s.rank_samples(step, dp, r, false);
      ASSERT_EQ(share.size(), static_cast<size_t>(gbs / dp));
      all.insert(all.end(), share.begin(), share.end());
    }
    EXPECT_EQ(all, s.step_units(step));
    epochs[step / 3].insert(epochs[step / 3].end(), all.begin(), all.end());
  }
  for (const auto& e : epochs) {
    EXPECT_EQ(std::set<int64_t>(e.begin(), e.end()).size(), e.size());  // no unit twice in an epoch
    for (int64_t u : e) EXPECT_TRUE(u >= 0 && u < units);
  }
  EXPECT_NE(epochs[0], epochs[1]);  // a fresh order each epoch (equal by chance with probability ~ 1/23!)
  EXPECT_EQ(BatchSchedule(units, gbs, seed).step_units(4), s.step_units(4));
  EXPECT_NE(BatchSchedule(units, gbs, seed + 1).step_units(0), s.step_units(0));
  // Pairs: both sequences of a unit, chosen first.
  const std::vector<int64_t> pairs = s.rank_samples(1, dp, 2, true);
  const std::vector<int64_t> unit_ids = s.rank_samples(1, dp, 2, false);
  ASSERT_EQ(pairs.size(), 2 * unit_ids.size());
  for (size_t i = 0; i < unit_ids.size(); ++i) {
    EXPECT_EQ(pairs[2 * i], 2 * unit_ids[i]);
    EXPECT_EQ(pairs[2 * i + 1], 2 * unit_ids[i] + 1);
  }
  EXPECT_THROW(BatchSchedule(5, 6, seed), Error);
  EXPECT_THROW(s.rank_samples(0, 4, 0, false), Error);
}

TEST(WorkerData, ExampleDataFilesMatchTheirConfigs) {
  for (const char* name : {"sft", "grpo", "dpo"}) {
    SCOPED_TRACE(name);
    const Config c = load_config(fs::path(RINGTRAIN_SOURCE_DIR) / "configs" / (std::string(name) + ".yaml"));
    const Dataset d =
        load_dataset(fs::path(RINGTRAIN_SOURCE_DIR) / c.train.data, data_spec(c, resolve_model_config(c.policy)));
    EXPECT_GE(d.units(), c.policy.train_global_batch_size);
  }
}

}  // namespace
}  // namespace ringtrain::worker
