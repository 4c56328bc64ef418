// The running log-sum-exp statistics of a set of logits, shared by the log-softmax over stored logits
// (logprob_rows.cu) and the LM head's fused epilogue (fused_gemm_sm90.cu), which keeps them per 128-column tile.
#pragma once

#include <cmath>

namespace ringtrain::model::cuda {

// The running statistics of a set of logits z: max, sum of exp(z - max) and, for the entropy, sum of
// exp(z - max) (z - max). A set of -inf logits only is (-inf, anything) and adds nothing. A NaN max is taken over
// (fmaxf would drop it) so that NaN logits give a NaN lse.
template <bool Entropy>
struct ExpSums {
  float max = -INFINITY, sum = 0.f, sum_ez = 0.f;

  __device__ void merge(float other_max, float other_sum, float other_sum_ez) {
    if (other_max == -INFINITY) return;
    if (max == -INFINITY || isnan(other_max)) {
      max = other_max, sum = other_sum, sum_ez = other_sum_ez;
      return;
    }
    const float m = fmaxf(max, other_max);
    const float shift = max - m, other_shift = other_max - m;
    const float scale = expf(shift), other_scale = expf(other_shift);
    // exp(z - m) (z - m) = exp(z - max) exp(shift) ((z - max) + shift)
    if constexpr (Entropy)
      sum_ez = scale * (sum_ez + shift * sum) + other_scale * (other_sum_ez + other_shift * other_sum);
    sum = sum * scale + other_sum * other_scale;
    max = m;
  }
  __device__ void shuffle_merge(int offset) {
    const float other_max = __shfl_xor_sync(0xffffffffu, max, offset);
    const float other_sum = __shfl_xor_sync(0xffffffffu, sum, offset);
    const float other_sum_ez = Entropy ? __shfl_xor_sync(0xffffffffu, sum_ez, offset) : 0.f;
    merge(other_max, other_sum, other_sum_ez);
  }
};

}  // namespace ringtrain::model::cuda
