#include "ringtrain/rl/tokenizer.h"

#include <algorithm>
#include <cstdio>

#include "ringtrain/core/error.h"

namespace ringtrain::rl {
namespace {

// A character as an error message shows it: 'x', or \xNN for a byte that is not printable ASCII.
std::string show_char(unsigned char c) {
  if (c >= 0x20 && c < 0x7f) return cat("'", static_cast<char>(c), "'");
  char hex[8];
  std::snprintf(hex, sizeof(hex), "\\x%02X", c);
  return hex;
}

}  // namespace

CharTokenizer::CharTokenizer() {
  std::fill(std::begin(id_of_), std::end(id_of_), -1);
  for (size_t i = 0; i < kCharacters.size(); ++i)
    id_of_[static_cast<unsigned char>(kCharacters[i])] = static_cast<int32_t>(3 + i);
}

std::vector<int32_t> CharTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    RT_CHECK(id_of_[c] >= 0, "tokenizer: character ", show_char(c), " at position ", i,
             " is not in the vocabulary (digits, lowercase letters and \"", kCharacters.substr(36), "\")");
    ids.push_back(id_of_[c]);
  }
  return ids;
}

std::vector<int32_t> CharTokenizer::encode_prompt(std::string_view text) const {
  std::vector<int32_t> ids{kBos};
  const std::vector<int32_t> body = encode(text);
  ids.insert(ids.end(), body.begin(), body.end());
  return ids;
}

std::vector<int32_t> CharTokenizer::encode_answer(std::string_view text) const {
  std::vector<int32_t> ids = encode(text);
  ids.push_back(kEos);
  return ids;
}

std::string CharTokenizer::decode(std::span<const int32_t> ids) const {
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    RT_CHECK(id >= 0 && id < vocab_size(), "tokenizer: id ", id, " at position ", i, " is outside the vocabulary [0, ",
             vocab_size(), ")");
    if (id == kPad) text += "<pad>";
    else if (id == kBos) text += "<bos>";
    else if (id == kEos) text += "<eos>";
    else text += kCharacters[static_cast<size_t>(id - 3)];
  }
  return text;
}

}  // namespace ringtrain::rl
