// Checked size arithmetic: sizes read from files and options are hostile, and a wrapped product passes every
// later bound check. Each operation throws an Error naming what was being computed.
#pragma once

#include <cstdint>
#include <string_view>

#include "ringtrain/core/error.h"

namespace ringtrain {

// a * b for non-negative sizes; `what` names the quantity ("tensor 'x' numel").
inline int64_t checked_mul(int64_t a, int64_t b, std::string_view what) {
  int64_t r = 0;
  RT_CHECK(a >= 0 && b >= 0 && !__builtin_mul_overflow(a, b, &r), what, ": ", a, " * ", b,
           " is negative or overflows 64 bits");
  return r;
}

inline int64_t checked_add(int64_t a, int64_t b, std::string_view what) {
  int64_t r = 0;
  RT_CHECK(a >= 0 && b >= 0 && !__builtin_add_overflow(a, b, &r), what, ": ", a, " + ", b,
           " is negative or overflows 64 bits");
  return r;
}

// The product of a shape's dimensions.
template <typename Dims>
int64_t checked_numel(const Dims& dims, std::string_view what) {
  int64_t n = 1;
  for (int64_t d : dims) n = checked_mul(n, d, what);
  return n;
}

}  // namespace ringtrain
