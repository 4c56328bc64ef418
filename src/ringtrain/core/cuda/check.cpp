#include "ringtrain/core/cuda/check.h"

#include <string_view>

namespace ringtrain::cuda {

void throw_call_error(const std::string& context, const char* expr, const char* library_message, const char* file,
                      int line) {
  // Paths from the source root's ringtrain/ folder on: the same in every build directory and worktree.
  std::string_view where(file);
  if (const size_t at = where.rfind("ringtrain/"); at != std::string_view::npos) where.remove_prefix(at + 10);
  throw Error(cat(context, context.empty() ? "" : ": ", expr, " failed: ", library_message, " (", where, ":", line,
                  ")"));
}

}  // namespace ringtrain::cuda
