// Errors: one exception type carrying a message that names what was wrong (file, key, shape).
#pragma once

#include <exception>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
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

// Concatenates any streamable values: cat("shape ", 3, "x", 4).
template <typename... Args>
std::string cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
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
