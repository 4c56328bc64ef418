// Shared by the CPU backends: moving one head's rows between strided tensors of any dtype and a dense [rows x D]
// scratch array (the sequences and row views of a call are in attention/layout.h).
#pragma once

#include <cstdint>
#include <vector>

#include "ringtrain/attention/layout.h"
#include "ringtrain/attention/params.h"

namespace ringtrain::attention::cpu {

template <typename Acc>
void load_head(const TensorView& rows, int64_t start, int64_t n, int64_t head, std::vector<Acc>& out) {
  const int64_t d = rows.shape[2];
  out.resize(static_cast<size_t>(n * d));
  for (int64_t r = 0; r < n; ++r) {
    const int64_t base = (start + r) * rows.stride[0] + head * rows.stride[1];
    for (int64_t j = 0; j < d; ++j)
      out[r * d + j] = static_cast<Acc>(load_as_double(rows.data, rows.dtype, base + j * rows.stride[2]));
  }
}

// Writes (or adds, when accumulate) a dense [n x D] array into one head's rows.
template <typename Acc>
void store_head(const TensorView& rows, int64_t start, int64_t n, int64_t head, const std::vector<Acc>& in,
                bool accumulate) {
  const int64_t d = rows.shape[2];
  for (int64_t r = 0; r < n; ++r) {
    const int64_t base = (start + r) * rows.stride[0] + head * rows.stride[1];
    for (int64_t j = 0; j < d; ++j) {
      const int64_t off = base + j * rows.stride[2];
      double v = static_cast<double>(in[r * d + j]);
      if (accumulate) v += load_as_double(rows.data, rows.dtype, off);
      store_from_double(rows.data, rows.dtype, off, v);
    }
  }
}

}  // namespace ringtrain::attention::cpu
