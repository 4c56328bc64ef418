// The known name a mistyped one most likely meant, for "did you mean" hints (config keys, subcommands).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace ringtrain {

// Levenshtein distance (insertions, deletions, substitutions of bytes).
size_t edit_distance(const std::string& a, const std::string& b);

// The name of `known` that `typed` most likely meant, or none when every one is too far to be a slip:
//  - names that hold each of typed's dot-separated parts, in order (a part left out: policy.optimizer.lr for
//    policy.optimizer.kwargs.lr; a name shortened: grpo.num_generations), the shortest of them;
//  - else the nearest by edit distance, when it is at most a third of typed's length (and at least 2).
std::optional<std::string> nearest_name(const std::string& typed, const std::vector<std::string>& known);

}  // namespace ringtrain
