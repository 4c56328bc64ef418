// Errors: one exception type carrying a message that names what was wrong (file, key, shape).
#pragma once

#include <charconv>
#include <exception>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace ringtrain {

// The text as it can be printed whole: control bytes (a NUL would end what() there, an escape sequence would reach
// the terminal) shown as \xNN; newline and tab kept when line_breaks (a message), escaped too when not (a value
// quoted on one line).
std::string printable(std::string_view text, bool line_breaks = true);

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(printable(what)) {}
};

namespace detail {
// A floating-point value as the shortest text that reads back as it (1.0000001 stays 1.0000001, where a stream's six
// digits would say 1 and make "1 must be in (0, 1]" of it); anything else as a stream writes it.
template <typename T>
void put(std::ostringstream& os, T&& v) {
  if constexpr (std::is_floating_point_v<std::remove_cvref_t<T>>) {
    char buf[64];
    const std::to_chars_result r = std::to_chars(buf, buf + sizeof buf, v);
    os.write(buf, r.ptr - buf);
  } else {
    os << std::forward<T>(v);
  }
}
}  // namespace detail

// Concatenates any streamable values: cat("shape ", 3, "x", 4).
template <typename... Args>
std::string cat(Args&&... args) {
  std::ostringstream os;
  (detail::put(os, std::forward<Args>(args)), ...);
  return os.str();
}

// f(), with an error whose message does not start with `prefix` rethrown as Error("<context>: <message>"), so that
// a file system's "cannot write X: ..." says which operation it came from.
template <typename F>
void with_context(const std::string& context, std::string_view prefix, F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    if (std::string_view(e.what()).starts_with(prefix)) throw;
    throw Error(context + ": " + e.what());
  }
}

}  // namespace ringtrain

// RT_CHECK(cond, parts...): throw ringtrain::Error with the concatenated message when cond is false.
#define RT_CHECK(cond, ...)                                  \
  do {                                                       \
    if (!(cond)) throw ::ringtrain::Error(::ringtrain::cat(__VA_ARGS__)); \
  } while (0)
