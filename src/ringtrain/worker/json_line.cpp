#include "ringtrain/worker/json_line.h"

#include "ringtrain/core/error.h"
#include "ringtrain/core/json.h"

namespace ringtrain::worker {
namespace {

struct TooDeep {};
struct TwiceGiven {
  std::string key;
};

}  // namespace

nlohmann::ordered_json parse_json_line(std::string_view line, int max_depth, const std::string& where) {
  using json = nlohmann::ordered_json;
  check_no_nul(line, where);
  // The callback sees a container's depth before it is entered (the outermost one at 0), and every key.
  ObjectKeys keys;
  const json::parser_callback_t limit = [&](int depth, json::parse_event_t event, json& parsed) {
    const bool opens = event == json::parse_event_t::object_start || event == json::parse_event_t::array_start;
    if (opens && depth >= max_depth) throw TooDeep{};
    if (!keys.fresh(event, parsed)) throw TwiceGiven{parsed.get<std::string>()};
    return true;
  };
  try {
    return json::parse(line.begin(), line.end(), limit);
  } catch (const TooDeep&) {
    throw Error(cat(where, ": nested deeper than ", max_depth, max_depth == 1 ? " level" : " levels"));
  } catch (const TwiceGiven& t) {
    throw Error(cat(where, ": key '", t.key.substr(0, 40), t.key.size() > 40 ? "...' " : "' ", "given twice"));
  } catch (const json::exception& e) {
    throw Error(cat(where, ": invalid JSON: ", e.what()));
  }
}

}  // namespace ringtrain::worker
