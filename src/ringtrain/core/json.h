// JSON from hostile sources: parsing with a nesting limit (nlohmann's recursive dump and comparisons overflow the
// stack on input nested 100,000 deep) and values quoted in messages at a bounded length.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace ringtrain {

// Deeper than any config, header or data line ringtrain reads.
constexpr int kMaxJsonDepth = 64;

// Parses `text`; an Error names `source` (file, or file:line) and what is wrong, including too deep nesting.
nlohmann::json parse_json(std::string_view text, const std::string& source);

// The value's JSON text, cut to `max_chars` with "..." (for error messages).
std::string json_excerpt(const nlohmann::json& value, size_t max_chars = 120);

}  // namespace ringtrain
