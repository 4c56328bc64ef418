// Hugging Face's sliding-window rule, written out independently of attention::key_start, and the window as a dense
// additive bias: the reference of the window tests (tests/attention, tests/attention_gpu).
#pragma once

#include <cstdint>
#include <limits>

#include "ringtrain/attention/params.h"
#include "ringtrain/core/tensor.h"

namespace ringtrain::testing {

// Hugging Face's rule (masking_utils: causal and sliding_window_overlay): key j is visible to query row i, at
// position pos = i (top-left) or i + Skv - Sq (bottom-right), when j <= pos and pos - j < w.
inline bool hf_visible(attention::MaskType m, int64_t w, int64_t i, int64_t j, int64_t sq, int64_t skv) {
  const int64_t pos = m == attention::MaskType::CausalBottomRight ? i + skv - sq : i;
  return j <= pos && (w == 0 || pos - j < w);
}

// The window as a bias [1, 1, Sq, Skv] fp64: 0 where the rule shows the key, -inf elsewhere.
inline Tensor window_bias(attention::MaskType m, int64_t w, int64_t sq, int64_t skv) {
  Tensor b = Tensor::empty({1, 1, sq, skv}, DType::F64);
  for (int64_t i = 0; i < sq; ++i)
    for (int64_t j = 0; j < skv; ++j)
      b.ptr<double>()[i * skv + j] = hf_visible(m, w, i, j, sq, skv) ? 0.0 : -std::numeric_limits<double>::infinity();
  return b;
}

}  // namespace ringtrain::testing
