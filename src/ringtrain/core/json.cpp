#include "ringtrain/core/json.h"

#include <unordered_set>
#include <vector>

#include "ringtrain/core/error.h"

namespace ringtrain {

void check_no_nul(std::string_view text, const std::string& source) {
  const size_t at = text.find('\0');
  RT_CHECK(at == std::string_view::npos, source, ": a NUL byte at byte ", at + 1, " (JSON text holds none)");
}

namespace {

// nlohmann's SAX interface: every value and container boundary, nothing built.
class ShapeChecker {
 public:
  using json = nlohmann::json;
  explicit ShapeChecker(int max_depth) : max_depth_(max_depth) {}
  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(json::number_integer_t) { return true; }
  bool number_unsigned(json::number_unsigned_t) { return true; }
  bool number_float(json::number_float_t, const json::string_t&) { return true; }
  bool string(json::string_t&) { return true; }
  bool binary(json::binary_t&) { return true; }
  bool start_object(std::size_t) {
    keys_.emplace_back();
    return open();
  }
  bool key(json::string_t& k) {
    if (keys_.back().insert(k).second) return true;
    issue_ = {JsonShapeIssue::KeyTwice, k};
    return false;
  }
  bool end_object() {
    keys_.pop_back();
    --depth_;
    return true;
  }
  bool start_array(std::size_t) { return open(); }
  bool end_array() {
    --depth_;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) { return false; }
  const JsonShapeIssue& issue() const { return issue_; }

 private:
  bool open() {
    if (depth_ >= max_depth_) {
      issue_ = {JsonShapeIssue::TooDeep, {}};
      return false;
    }
    ++depth_;
    return true;
  }
  int max_depth_, depth_ = 0;
  std::vector<std::unordered_set<std::string>> keys_;
  JsonShapeIssue issue_;
};

}  // namespace

JsonShapeIssue check_json_shape(std::string_view text, int max_depth) {
  ShapeChecker checker(max_depth);
  nlohmann::json::sax_parse(text.begin(), text.end(), &checker);
  return checker.issue();
}

namespace {

template <typename Json>
Json parse_checked(std::string_view text, const std::string& source, int max_depth) {
  check_no_nul(text, source);
  const JsonShapeIssue issue = check_json_shape(text, max_depth);
  RT_CHECK(issue.kind != JsonShapeIssue::TooDeep, source, ": JSON nested deeper than ", max_depth,
           max_depth == 1 ? " level" : " levels");
  RT_CHECK(issue.kind != JsonShapeIssue::KeyTwice, source, ": key ", json_excerpt(issue.key), " given twice");
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {  // a syntax error, or a number too large for a double
    throw Error(cat(source, ": invalid JSON: ", e.what()));
  }
}

}  // namespace

nlohmann::json parse_json(std::string_view text, const std::string& source, int max_depth) {
  return parse_checked<nlohmann::json>(text, source, max_depth);
}

nlohmann::ordered_json parse_ordered_json(std::string_view text, const std::string& source, int max_depth) {
  return parse_checked<nlohmann::ordered_json>(text, source, max_depth);
}

std::string json_excerpt(const nlohmann::json& value, size_t max_chars) {
  std::string s = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > max_chars) s = s.substr(0, max_chars) + "...";
  return s;
}

}  // namespace ringtrain
