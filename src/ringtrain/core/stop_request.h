// A request to stop a long call at its next safe point (Ctrl-C in the Python module), read by the layers that have
// such points: scoring and training between microbatches, sampling between tokens. Setting it is lock-free, so a
// signal handler may do it. A stopped call throws comm::Interrupted after its ranks agree (comm/agreed.h).
#pragma once

#include <atomic>

namespace ringtrain {

class StopRequest {
 public:
  void request() noexcept { requested_.store(true, std::memory_order_relaxed); }
  void clear() noexcept { requested_.store(false, std::memory_order_relaxed); }
  bool requested() const noexcept { return requested_.load(std::memory_order_relaxed); }

 private:
  static_assert(std::atomic<bool>::is_always_lock_free, "a signal handler sets it");
  std::atomic<bool> requested_{false};
};

}  // namespace ringtrain
