#include "ringtrain/rl/task.h"

#include <algorithm>

#include "ringtrain/core/error.h"
#include "ringtrain/core/hashed_normal.h"

namespace ringtrain::rl {

ReverseDigitsTask::ReverseDigitsTask(uint64_t seed, int64_t min_digits, int64_t max_digits)
    : seed_(seed), min_digits_(min_digits), max_digits_(max_digits) {
  // The bound keeps prompts short enough for the tiny policies this task is for, and the draws below cheap.
  RT_CHECK(min_digits >= 1 && min_digits <= max_digits && max_digits <= 64, "reverse task: digits from ", min_digits,
           " to ", max_digits, " (need 1 <= min <= max <= 64)");
}

Example ReverseDigitsTask::example(uint64_t index) const {
  // Draw k of the example comes from hash(seed, index, k): the length first, then each digit.
  const uint64_t base = splitmix64(splitmix64(seed_) ^ index);
  const auto draw = [&](uint64_t k, uint64_t n) { return splitmix64(base ^ splitmix64(k)) % n; };
  const uint64_t lengths = static_cast<uint64_t>(max_digits_ - min_digits_ + 1);
  const int64_t digits = min_digits_ + static_cast<int64_t>(draw(0, lengths));
  Example e;
  for (int64_t i = 0; i < digits; ++i) e.prompt += static_cast<char>('0' + draw(static_cast<uint64_t>(i) + 1, 10));
  e.answer.assign(e.prompt.rbegin(), e.prompt.rend());
  e.prompt += '=';
  return e;
}

Example ReverseDigitsTask::longest_example() const {
  return {std::string(static_cast<size_t>(max_digits_), '9') + '=', std::string(static_cast<size_t>(max_digits_), '9'),
          cat("the built-in task's longest prompt (", max_digits_, " digits)")};
}

std::vector<Example> ReverseDigitsTask::examples(uint64_t first, int64_t count) const {
  RT_CHECK(count >= 0, "reverse task: negative example count ", count);
  std::vector<Example> out;
  out.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) out.push_back(example(first + static_cast<uint64_t>(i)));
  return out;
}

RewardMode parse_reward_mode(const std::string& name) {
  if (name == "exact") return RewardMode::Exact;
  if (name == "partial") return RewardMode::Partial;
  throw Error(cat("reward mode '", name, "' is not one of: exact, partial"));
}

double reward(const CharTokenizer& tokenizer, const std::string& answer, std::span<const int32_t> response,
              RewardMode mode) {
  const std::vector<int32_t> want = tokenizer.encode_answer(answer);
  const auto eos = std::find(response.begin(), response.end(), CharTokenizer::kEos);
  const std::span<const int32_t> got(response.begin(), eos == response.end() ? eos : eos + 1);
  if (mode == RewardMode::Exact) return std::ranges::equal(got, want) ? 1.0 : 0.0;
  size_t matches = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) matches += got[i] == want[i];
  return static_cast<double>(matches) / static_cast<double>(std::max(got.size(), want.size()));
}

}  // namespace ringtrain::rl
