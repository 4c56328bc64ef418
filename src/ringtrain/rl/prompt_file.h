// Prompts with reference answers from a JSONL file, one object per line: {"prompt": "...", "answer": "..."}; blank
// lines are skipped. Errors name the file and line: malformed JSON, a missing, extra or non-string key, a nested
// value, an over-long line, and (through the tokenizer) a character outside its vocabulary.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "ringtrain/rl/task.h"
#include "ringtrain/rl/tokenizer.h"

namespace ringtrain::rl {

constexpr int64_t kMaxPromptLineBytes = int64_t{1} << 20;

std::vector<Example> read_prompt_file(const std::filesystem::path& path, const CharTokenizer& tokenizer);

}  // namespace ringtrain::rl
