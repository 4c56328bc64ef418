#include "ringtrain/core/json.h"

#include "ringtrain/core/error.h"

namespace ringtrain {

void check_no_nul(std::string_view text, const std::string& source) {
  const size_t at = text.find('\0');
  RT_CHECK(at == std::string_view::npos, source, ": a NUL byte at byte ", at + 1, " (JSON text holds none)");
}

nlohmann::json parse_json(std::string_view text, const std::string& source) {
  using nlohmann::json;
  check_no_nul(text, source);
  // The callback sees every container start with its depth before the parser descends into it, and every key
  // before its value.
  ObjectKeys keys;
  const json::parser_callback_t check = [&](int depth, json::parse_event_t event, json& parsed) {
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
        depth >= kMaxJsonDepth)
      throw Error(cat(source, ": JSON nested deeper than ", kMaxJsonDepth, " levels"));
    if (!keys.fresh(event, parsed)) throw Error(cat(source, ": key ", json_excerpt(parsed), " given twice"));
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), check);
  } catch (const json::exception& e) {
    throw Error(cat(source, ": invalid JSON: ", e.what()));
  }
}

std::string json_excerpt(const nlohmann::json& value, size_t max_chars) {
  std::string s = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > max_chars) s = s.substr(0, max_chars) + "...";
  return s;
}

}  // namespace ringtrain
