// Messages for failed system calls: what failed, on which path, and the errno text (read before anything else
// can overwrite errno).
#pragma once

#include <cerrno>
#include <string>
#include <string_view>

#include "ringtrain/core/error.h"

namespace ringtrain {

// "cannot open /a/b: No such file or directory" from the errno value `err`.
std::string sys_message(std::string_view what, std::string_view path, int err);

// Throws Error(sys_message(what, path, errno)); call it right after the failed call.
[[noreturn]] void throw_sys_error(std::string_view what, std::string_view path);

// Writes to stdout and flushes; an error (with errno's text) when the output cannot be written, e.g. a full disk.
void write_stdout(std::string_view text);
// Flushes stdout; an error when anything written to it so far was lost.
void check_stdout();

}  // namespace ringtrain
