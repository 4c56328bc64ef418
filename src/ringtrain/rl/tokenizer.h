// A character-level tokenizer with a fixed vocabulary, for the built-in RL tasks: a tiny policy trained from
// scratch needs no real tokenizer, and a fixed vocabulary makes checkpoints and prompt files portable.
// Ids: 0 PAD, 1 BOS, 2 EOS, then one id per character of kCharacters, in that order.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ringtrain::rl {

class CharTokenizer {
 public:
  static constexpr int32_t kPad = 0, kBos = 1, kEos = 2;
  static constexpr std::string_view kCharacters = "0123456789abcdefghijklmnopqrstuvwxyz +-*/=<>(),.:?";

  CharTokenizer();
  int64_t vocab_size() const { return 3 + static_cast<int64_t>(kCharacters.size()); }

  // One id per character; a character outside the vocabulary is an error naming it (printable, or as \xNN) and
  // its position.
  std::vector<int32_t> encode(std::string_view text) const;
  // BOS, then the text: what a policy is prompted with.
  std::vector<int32_t> encode_prompt(std::string_view text) const;
  // The text, then EOS: what a policy should generate.
  std::vector<int32_t> encode_answer(std::string_view text) const;
  // Characters, with PAD, BOS and EOS written <pad>, <bos>, <eos>; an id outside the vocabulary is an error.
  std::string decode(std::span<const int32_t> ids) const;

 private:
  int32_t id_of_[256];
};

}  // namespace ringtrain::rl
