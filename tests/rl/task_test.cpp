// The built-in RL task: the character tokenizer, the reverse-digits examples and the reward, against hand-worked
// cases; the JSONL prompt reader against well-formed and hostile files.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "ringtrain/core/error.h"
#include "ringtrain/rl/prompt_file.h"
#include "ringtrain/rl/task.h"
#include "ringtrain/rl/tokenizer.h"
#include "test_util.h"

namespace ringtrain {
namespace {

using rl::CharTokenizer;
using rl::RewardMode;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(CharTokenizer, RoundTripAndFixedIds) {
  const CharTokenizer tok;
  EXPECT_EQ(tok.vocab_size(), 3 + 10 + 26 + 14);
  const std::string all(CharTokenizer::kCharacters);
  const std::vector<int32_t> ids = tok.encode(all);
  ASSERT_EQ(ids.size(), all.size());
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(ids[i], static_cast<int32_t>(3 + i));  // fixed: files stay valid
  EXPECT_EQ(tok.decode(ids), all);
  EXPECT_EQ(tok.encode("07="), (std::vector<int32_t>{3, 10, 3 + 36 + 5}));
  EXPECT_EQ(tok.encode_prompt("12"), (std::vector<int32_t>{CharTokenizer::kBos, 4, 5}));
  EXPECT_EQ(tok.encode_answer("21"), (std::vector<int32_t>{5, 4, CharTokenizer::kEos}));
  EXPECT_EQ(tok.decode(std::vector<int32_t>{1, 4, 2, 0}), "<bos>1<eos><pad>");
  EXPECT_TRUE(tok.encode("").empty());
}

TEST(CharTokenizer, ErrorsNameTheCharacter) {
  const CharTokenizer tok;
  std::string e = error_of([&] { tok.encode("12A3"); });
  EXPECT_NE(e.find("'A' at position 2"), std::string::npos) << e;
  e = error_of([&] { tok.encode("1\xc3\xa9"); });  // UTF-8 é: its first byte is named
  EXPECT_NE(e.find("\\xC3 at position 1"), std::string::npos) << e;
  e = error_of([&] { tok.encode(std::string("a\0b", 3)); });
  EXPECT_NE(e.find("\\x00 at position 1"), std::string::npos) << e;
  e = error_of([&] { tok.decode(std::vector<int32_t>{4, 53}); });
  EXPECT_NE(e.find("id 53 at position 1"), std::string::npos) << e;
  e = error_of([&] { tok.decode(std::vector<int32_t>{-1}); });
  EXPECT_NE(e.find("id -1"), std::string::npos) << e;
}

TEST(ReverseDigitsTask, ExamplesAreCounterBasedReversals) {
  const uint64_t seed = testing::fresh_seed();
  const rl::ReverseDigitsTask task(seed, 3, 5);
  const std::vector<rl::Example> batch = task.examples(100, 2000);
  std::set<size_t> lengths;
  std::vector<int64_t> digit_count(10, 0);
  for (size_t i = 0; i < batch.size(); ++i) {
    const rl::Example& e = batch[i];
    ASSERT_EQ(e.prompt.back(), '=');
    const std::string digits = e.prompt.substr(0, e.prompt.size() - 1);
    ASSERT_TRUE(std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) << e.prompt;
    ASSERT_EQ(e.answer, std::string(digits.rbegin(), digits.rend()));
    lengths.insert(digits.size());
    for (char c : digits) ++digit_count[c - '0'];
    // Counter-based: the same index alone, from another task object of the same seed, gives the same example.
    if (i % 97 == 0) {
      const rl::Example again = rl::ReverseDigitsTask(seed, 3, 5).example(100 + i);
      ASSERT_EQ(again.prompt, e.prompt);
    }
  }
  EXPECT_EQ(lengths, (std::set<size_t>{3, 4, 5}));
  // About 8000 digits, 800 each: a digit under 600 or over 1000 is > 7 standard deviations off.
  for (int d = 0; d < 10; ++d) {
    EXPECT_GT(digit_count[d], 600) << d;
    EXPECT_LT(digit_count[d], 1000) << d;
  }
  // Another seed, another stream.
  const rl::ReverseDigitsTask other(seed + 1, 3, 5);
  int same = 0;
  for (int i = 0; i < 50; ++i) same += other.example(100 + i).prompt == batch[i].prompt;
  EXPECT_LT(same, 5);
  EXPECT_THROW(rl::ReverseDigitsTask(seed, 0, 3), Error);
  EXPECT_THROW(rl::ReverseDigitsTask(seed, 4, 3), Error);
}

TEST(Reward, HandWorkedCases) {
  const CharTokenizer tok;
  const auto r = [&](const std::string& answer, std::vector<int32_t> response, RewardMode mode) {
    return rl::reward(tok, answer, response, mode);
  };
  const int32_t eos = CharTokenizer::kEos;
  const std::vector<int32_t> right = tok.encode_answer("321");  // 3 2 1 <eos>
  EXPECT_EQ(r("321", right, RewardMode::Partial), 1.0);
  EXPECT_EQ(r("321", right, RewardMode::Exact), 1.0);
  std::vector<int32_t> after_eos = right;
  after_eos.insert(after_eos.end(), {4, 5, eos});  // ignored after the first EOS
  EXPECT_EQ(r("321", after_eos, RewardMode::Exact), 1.0);
  EXPECT_EQ(r("321", tok.encode("321"), RewardMode::Partial), 0.75);  // cut before its EOS: 3 of 4
  EXPECT_EQ(r("321", tok.encode("321"), RewardMode::Exact), 0.0);
  EXPECT_EQ(r("321", tok.encode_answer("3214"), RewardMode::Partial), 3.0 / 5);  // an extra digit
  EXPECT_EQ(r("321", tok.encode_answer("123"), RewardMode::Partial), 2.0 / 4);   // middle digit and EOS
  EXPECT_EQ(r("321", tok.encode_answer("21"), RewardMode::Partial), 0.0);        // shifted: nothing lines up
  EXPECT_EQ(r("321", {eos}, RewardMode::Partial), 0.0);
  EXPECT_EQ(r("321", {}, RewardMode::Partial), 0.0);
  EXPECT_EQ(r("321", {CharTokenizer::kBos, 6, 5, 4, eos}, RewardMode::Partial), 0.0);  // shifted by a BOS
  EXPECT_EQ(r("321", {CharTokenizer::kPad, 5, 4, eos}, RewardMode::Partial), 0.75);
  EXPECT_EQ(r("321", {6, 5, 4, eos, 99}, RewardMode::Partial), 1.0);  // ids past the tokenizer's (a larger model vocab)
  EXPECT_EQ(r("", {eos}, RewardMode::Exact), 1.0);
  EXPECT_EQ(rl::parse_reward_mode("partial"), RewardMode::Partial);
  EXPECT_NE(error_of([] { rl::parse_reward_mode("fuzzy"); }).find("'fuzzy'"), std::string::npos);
}

class PromptFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("rt_prompts_" + std::to_string(testing::fresh_seed()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path write(const std::string& text) {
    const std::filesystem::path p = dir_ / "prompts.jsonl";
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }
  std::string error_reading(const std::string& text) {
    const std::filesystem::path p = write(text);
    return error_of([&] { rl::read_prompt_file(p, tok_); });
  }
  std::filesystem::path dir_;
  CharTokenizer tok_;
};

TEST_F(PromptFile, ReadsRecordsSkippingBlankLines) {
  const std::string text =
      "{\"prompt\": \"12+3=\", \"answer\": \"15\"}\n\n  \r\n{\"answer\": \"ba\", \"prompt\": \"rev ab:\"}";
  const auto examples = rl::read_prompt_file(write(text), tok_);
  ASSERT_EQ(examples.size(), 2u);
  EXPECT_EQ(examples[0].prompt, "12+3=");
  EXPECT_EQ(examples[0].answer, "15");
  EXPECT_EQ(examples[1].prompt, "rev ab:");
  EXPECT_EQ(examples[1].answer, "ba");
}

TEST_F(PromptFile, ErrorsNameFileAndLine) {
  const std::string ok = "{\"prompt\": \"1=\", \"answer\": \"1\"}\n";
  const auto expect = [&](const std::string& text, const std::string& needle) {
    const std::string e = error_reading(text);
    EXPECT_NE(e.find(needle), std::string::npos) << "wanted '" << needle << "' in: " << e;
    EXPECT_NE(e.find("prompts.jsonl"), std::string::npos) << e;
  };
  expect(ok + "{\"prompt\": \"1=\"", ":2: invalid JSON");
  expect(ok + "{\"prompt\": \"12\", \"answer\": 1e999}", ":2: invalid JSON: ");  // a number past a double
  expect(ok + ok + "{\"prompt\": \"1=\"}\n", ":3: missing key 'answer'");
  expect(ok + "{\"prompt\": 1, \"answer\": \"1\"}", ":2: key 'prompt' must be a string");
  expect(ok + "{\"prompt\": \"1=\", \"answer\": \"1\", \"id\": \"x\"}", ":2: unknown key 'id'");
  expect(ok + "{\"prompt\": {\"a\": [[[1]]]}, \"answer\": \"1\"}", ":2: JSON nested deeper than 1 level");
  expect(ok + "{\"prompt\": \"12=\", \"answer\": \"21\", \"answer\": \"x\"}", ":2: key \"answer\" given twice");
  expect(ok + "[1, 2]", ":2: a record must be a JSON object");
  expect(ok + "{\"prompt\": \"1=\", \"answer\": \"X\"}", ":2: key 'answer': tokenizer: character 'X' at position 0");
  expect(ok + "{\"prompt\": \"\", \"answer\": \"1\"}", ":2: empty prompt");
  expect("\n\n", "no records");
  expect(ok + std::string(static_cast<size_t>(rl::kMaxPromptLineBytes) + 10, ' '), ":2: line longer than");
  // Deep nesting is refused at its first level, before the parser descends.
  expect(ok + "{\"prompt\": " + std::string(100000, '[') + "}", ":2: JSON nested deeper than 1 level");
  EXPECT_NE(error_of([&] { rl::read_prompt_file(dir_, tok_); }).find("not a regular file"), std::string::npos);
  EXPECT_NE(error_of([&] { rl::read_prompt_file(dir_ / "missing.jsonl", tok_); }).find("not a regular file"),
            std::string::npos);
}

}  // namespace
}  // namespace ringtrain
