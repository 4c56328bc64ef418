// Restores the default attention backend allow-list when a test that changed it ends, however it ends.
#pragma once

#include "ringtrain/attention/selection.h"

namespace ringtrain::testing {

struct RootListGuard {
  RootListGuard() = default;
  RootListGuard(const RootListGuard&) = delete;
  RootListGuard& operator=(const RootListGuard&) = delete;
  ~RootListGuard() { attention::reset_root_backends(); }
};

}  // namespace ringtrain::testing
