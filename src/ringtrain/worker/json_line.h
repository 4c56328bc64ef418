// One line of a JSONL file parsed with a nesting limit: a container deeper than the limit is refused while parsing,
// before anything is built, so a hostile line cannot exhaust the stack or memory through nesting.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace ringtrain::worker {

// max_depth counts containers: 1 allows an object of scalars, 2 an object of lists. Keys keep their order in the line.
// Errors name `where`.
nlohmann::ordered_json parse_json_line(std::string_view line, int max_depth, const std::string& where);

}  // namespace ringtrain::worker
