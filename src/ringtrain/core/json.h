// JSON from hostile sources: parsing with a nesting limit (nlohmann's recursive dump and comparisons overflow the
// stack on input nested 100,000 deep), no key given twice in one object, and values quoted in messages at a bounded
// length.
#pragma once

#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace ringtrain {

// Deeper than any config, header or data line ringtrain reads.
constexpr int kMaxJsonDepth = 64;

// The keys of the objects being parsed, fed from a parser callback (nlohmann::json or ordered_json): a key given
// twice in one object, which the parser would resolve silently (the last one winning), makes fresh() false.
class ObjectKeys {
 public:
  template <typename Json>
  bool fresh(nlohmann::json::parse_event_t event, const Json& parsed) {
    using event_t = nlohmann::json::parse_event_t;
    if (event == event_t::object_start) open_.emplace_back();
    if (event == event_t::object_end) open_.pop_back();
    return event != event_t::key || open_.back().insert(parsed.template get<std::string>()).second;
  }

 private:
  std::vector<std::set<std::string>> open_;
};

// An Error naming `source` when `text` holds a NUL byte: nlohmann's parser takes it for the end of the input, so what
// follows it would be ignored unseen.
void check_no_nul(std::string_view text, const std::string& source);

// Parses `text`; an Error names `source` (file, or file:line) and what is wrong, including too deep nesting and a
// key given twice in one object, and a NUL byte.
nlohmann::json parse_json(std::string_view text, const std::string& source);

// The value's JSON text, cut to `max_chars` with "..." (for error messages).
std::string json_excerpt(const nlohmann::json& value, size_t max_chars = 120);

}  // namespace ringtrain
