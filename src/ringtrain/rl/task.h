// The built-in RL task and its verifiable reward: reverse a string of digits ("4071=" -> "1704"). A policy must
// learn a position-dependent copy (output j reads the digit 2j + 1 tokens back, whatever the length), which a
// 2-layer model of hidden 64 learns in minutes on a CPU; the partial-credit reward gives a gradient before the first
// exact answer.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ringtrain/rl/tokenizer.h"

namespace ringtrain::rl {

// A prompt and the answer a response is rewarded against (texts, without BOS/EOS).
struct Example {
  std::string prompt, answer;
  std::string origin;  // where it was read ("FILE:LINE" of a prompt file), for messages; empty for a generated task
};

// Reverse min_digits..max_digits random digits. Examples are counter-based: example(i) depends only on (seed, i),
// so a run resumes or shards its prompt stream by index with no generator state.
class ReverseDigitsTask {
 public:
  explicit ReverseDigitsTask(uint64_t seed, int64_t min_digits = 3, int64_t max_digits = 5);
  Example example(uint64_t index) const;
  std::vector<Example> examples(uint64_t first, int64_t count) const;
  // An example of max_digits digits: no prompt or answer of the task is longer.
  Example longest_example() const;

 private:
  uint64_t seed_;
  int64_t min_digits_, max_digits_;
};

enum class RewardMode : uint8_t { Exact, Partial };
RewardMode parse_reward_mode(const std::string& name);  // exact, partial

// The reward in [0, 1] of a response (the sampled ids, as model::Generation::tokens) to an example whose answer is
// `answer`. Both sides are compared as token ids up to and including the first EOS (the answer's EOS appended;
// anything a response has after its first EOS is ignored).
//   Exact:   1 if the response is the answer followed by EOS, else 0.
//   Partial: the fraction of positions that match, over the longer of the two: a right answer without its EOS
//            (cut at max_new_tokens) scores n / (n + 1), an extra character costs as much as a wrong one.
double reward(const CharTokenizer& tokenizer, const std::string& answer, std::span<const int32_t> response,
              RewardMode mode);

}  // namespace ringtrain::rl
