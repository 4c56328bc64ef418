// JSON from hostile sources: parsing with a nesting limit (nlohmann's recursive dump and comparisons overflow the
// stack on input nested 100,000 deep), no key given twice in one object, and values quoted in messages at a bounded
// length.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace ringtrain {

// Deeper than any config, header or data line ringtrain reads.
constexpr int kMaxJsonDepth = 64;

// What a parser would accept silently: nesting deeper than a limit (containers at depth max_depth or more, the
// outermost at 0), or a key given twice in one object (the last one would win).
struct JsonShapeIssue {
  enum Kind { None, TooDeep, KeyTwice } kind = None;
  std::string key;  // KeyTwice: the key
};
// Checks `text` in one pass (nlohmann's SAX interface), in time linear in its size: a callback on the DOM parser
// would make parsing quadratic in the number of objects. Text that is no JSON passes: parsing it names the error.
JsonShapeIssue check_json_shape(std::string_view text, int max_depth);

// An Error naming `source` when `text` holds a NUL byte: nlohmann's parser takes it for the end of the input, so what
// follows it would be ignored unseen.
void check_no_nul(std::string_view text, const std::string& source);

// Parses `text`; an Error names `source` (file, or file:line) and what is wrong, including nesting deeper than
// max_depth containers (1: an object of scalars, 2: an object of lists), a key given twice in one object, and a NUL
// byte. The checks run before anything is built, so a hostile text cannot exhaust the stack or memory through nesting.
nlohmann::json parse_json(std::string_view text, const std::string& source, int max_depth = kMaxJsonDepth);
// The same, the keys of each object kept in the order of the text.
nlohmann::ordered_json parse_ordered_json(std::string_view text, const std::string& source,
                                          int max_depth = kMaxJsonDepth);

// The value's JSON text, cut to `max_chars` with "..." (for error messages).
std::string json_excerpt(const nlohmann::json& value, size_t max_chars = 120);

}  // namespace ringtrain
