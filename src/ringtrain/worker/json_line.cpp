#include "ringtrain/worker/json_line.h"

#include "ringtrain/core/error.h"
#include "ringtrain/core/json.h"

namespace ringtrain::worker {
nlohmann::ordered_json parse_json_line(std::string_view line, int max_depth, const std::string& where) {
  using json = nlohmann::ordered_json;
  check_no_nul(line, where);
  const JsonShapeIssue issue = check_json_shape(line, max_depth);
  RT_CHECK(issue.kind != JsonShapeIssue::TooDeep, where, ": nested deeper than ", max_depth,
           max_depth == 1 ? " level" : " levels");
  RT_CHECK(issue.kind != JsonShapeIssue::KeyTwice, where, ": key '", issue.key.substr(0, 40),
           issue.key.size() > 40 ? "...' " : "' ", "given twice");
  try {
    return json::parse(line.begin(), line.end());
  } catch (const json::exception& e) {
    throw Error(cat(where, ": invalid JSON: ", e.what()));
  }
}

}  // namespace ringtrain::worker
