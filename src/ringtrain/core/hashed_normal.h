// A normal deviate from (seed, index) alone: splitmix64 hashes give two uniforms, Box-Muller makes one N(0,1).
// Shared by host and device code (fill_normal_hashed), so both draw the same values.
#pragma once

#include <cmath>
#include <cstdint>

#include "ringtrain/core/host_device.h"

namespace ringtrain {

RT_HOST_DEVICE inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

RT_HOST_DEVICE inline double hashed_normal(uint64_t seed, uint64_t index) {
  const uint64_t a = splitmix64(seed ^ splitmix64(2 * index)), b = splitmix64(seed ^ splitmix64(2 * index + 1));
  const double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;          // [0, 1)
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

}  // namespace ringtrain
