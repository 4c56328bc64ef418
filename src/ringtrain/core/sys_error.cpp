#include "ringtrain/core/sys_error.h"

#include <cstdio>
#include <cstring>

namespace ringtrain {

std::string sys_message(std::string_view what, std::string_view path, int err) {
  return cat(what, " ", path, ": ", err != 0 ? std::strerror(err) : "unknown error (errno not set)");
}

void throw_sys_error(std::string_view what, std::string_view path) {
  const int err = errno;
  throw Error(sys_message(what, path, err));
}

void write_stdout(std::string_view text) {
  errno = 0;
  std::fwrite(text.data(), 1, text.size(), stdout);
  check_stdout();
}

void check_stdout() {
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    const int err = errno;
    throw Error(sys_message("cannot write to", "standard output", err));
  }
}

}  // namespace ringtrain
