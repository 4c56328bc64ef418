// A minimal parallel loop for host kernels (CPU attention, CPU model layers).
#pragma once

#include <cstdint>
#include <functional>

namespace ringtrain {

// Runs fn(i) for every i in [0, n) on this thread and up to `host_threads()` - 1 pool workers, started once; rethrows the
// first exception (the items not begun by then are skipped). Serial inside another parallel loop, and while another
// thread's loop holds the pool.
void parallel_for(int64_t n, const std::function<void(int64_t)>& fn);
// Threads used by parallel_for: RINGTRAIN_HOST_THREADS, else the hardware concurrency.
int host_threads();

}  // namespace ringtrain
