#include "ringtrain/worker/json_line.h"

#include "ringtrain/core/error.h"

namespace ringtrain::worker {
namespace {

struct TooDeep {};

}  // namespace

nlohmann::ordered_json parse_json_line(std::string_view line, int max_depth, const std::string& where) {
  using json = nlohmann::ordered_json;
  // The callback sees a container's depth before it is entered (the outermost one at 0).
  const json::parser_callback_t limit = [max_depth](int depth, json::parse_event_t event, json&) {
    const bool opens = event == json::parse_event_t::object_start || event == json::parse_event_t::array_start;
    if (opens && depth >= max_depth) throw TooDeep{};
    return true;
  };
  try {
    return json::parse(line.begin(), line.end(), limit);
  } catch (const TooDeep&) {
    throw Error(cat(where, ": nested deeper than ", max_depth, max_depth == 1 ? " level" : " levels"));
  } catch (const json::exception& e) {
    throw Error(cat(where, ": invalid JSON: ", e.what()));
  }
}

}  // namespace ringtrain::worker
