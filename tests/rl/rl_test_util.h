// Helpers of the rl tests.
#pragma once

#include <utility>
#include <vector>

#include "ringtrain/model/generate.h"
#include "ringtrain/rl/task.h"
#include "ringtrain/rl/tokenizer.h"

namespace ringtrain::rl::testing {

// The mean partial and exact reward of `generations`, the responses to `examples` in order.
inline std::pair<double, double> mean_rewards(const std::vector<Example>& examples,
                                              const std::vector<model::Generation>& generations) {
  const CharTokenizer tok;
  double partial = 0, exact = 0;
  for (size_t i = 0; i < examples.size(); ++i) {
    partial += reward(tok, examples[i].answer, generations[i].tokens, RewardMode::Partial);
    exact += reward(tok, examples[i].answer, generations[i].tokens, RewardMode::Exact);
  }
  const double n = static_cast<double>(examples.size());
  return {partial / n, exact / n};
}

}  // namespace ringtrain::rl::testing
