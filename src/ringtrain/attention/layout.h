// How a call's tensors are laid out, for every backend: the sequences of a call (one per batch entry, or per document
// of a packed call) and the [rows, heads, D] / [heads, rows] views of one of them.
#pragma once

#include <cstdint>
#include <vector>

#include "ringtrain/attention/params.h"

namespace ringtrain::attention {

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

}  // namespace ringtrain::attention
