// Shared by the CPU backends: the (sequence, head) work items of a call, and moving one head's rows
// between strided tensors of any dtype and a dense [rows x D] scratch array.
#pragma once

#include <cstdint>
#include <vector>

#include "ringtrain/attention/params.h"

namespace ringtrain::attention::cpu {

// One sequence of a call: rows [q_start, q_start + sq) of the q-side tensors, [k_start, k_start + skv) of the
// k-side ones, in the 3-D [rows, heads, D] views of batch entry `batch` (BSHD) or of the packed tensors (THD).
struct Segment {
  int64_t batch = 0;
  int64_t q_start = 0, sq = 0;
  int64_t k_start = 0, skv = 0;
};

std::vector<Segment> segments(const AttnParams& p, const TensorView& cu_q, const TensorView& cu_kv);

// The [rows, heads, D] view of a BSHD (batch b) or THD tensor.
TensorView rows_view(const AttnParams& p, const TensorView& t, int64_t batch);
// The [heads, rows] view of the LSE for batch b.
TensorView lse_view(const AttnParams& p, const TensorView& lse, int64_t batch);

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
