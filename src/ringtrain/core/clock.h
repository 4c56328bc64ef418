// Host wall time for the phase times of logs, metrics and benchmarks: the steady clock, read in seconds.
#pragma once

#include <chrono>

namespace ringtrain {

using SteadyClock = std::chrono::steady_clock;

inline double seconds_since(SteadyClock::time_point t) {
  return std::chrono::duration<double>(SteadyClock::now() - t).count();
}

}  // namespace ringtrain
