// The online softmax of one thread's two rows of a wgmma m64nN score accumulator (rows g and g + 8 of its warp's
// 16, column pairs 8j + 2t; wgmma.cuh), in the log2 domain: exponentials are one MUFU instruction each.
#pragma once

#include "ringtrain/attention/cuda/flash_tile.cuh"

namespace ringtrain::attention::cuda {

template <int kCols>
struct OnlineSoftmax {
  float row_max[2] = {-INFINITY, -INFINITY};  // of the raw scores seen so far
  float row_sum[2] = {0.f, 0.f};              // this thread's share of the row sums, at row_max
  float scale_log2;                           // softmax scale * log2(e)

  __device__ explicit OnlineSoftmax(float scale) : scale_log2(scale * tile::kLog2e) {}

  // Replaces the scores s (hidden ones already -inf) by their weights exp(scale * (s - max)) at the new running max,
  // adds them to the sums, and gives the factor that brings what was accumulated at the old max to the new one.
  __device__ __forceinline__ void update(float (&s)[kCols / 2], float (&alpha)[2]) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float mx = row_max[half];
#pragma unroll
      for (int j = 0; j < kCols / 8; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * half], s[4 * j + 2 * half + 1]));
      mx = tile::quad_max(mx);
      // A row that has seen no finite score keeps max -inf; 0 in its place makes every weight exp2(-inf) = 0.
      const float m_use = mx == -INFINITY ? 0.f : mx * scale_log2;
      alpha[half] = tile::exp2_approx(row_max[half] * scale_log2 - m_use);
      row_max[half] = mx;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kCols / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[4 * j + 2 * half + e];
          x = tile::exp2_approx(fmaf(x, scale_log2, -m_use));
          sum += x;
        }
      row_sum[half] = fmaf(row_sum[half], alpha[half], sum);
    }
  }

  // o (an m64nD accumulator over the same rows) *= alpha, row by row.
  template <int N>
  __device__ __forceinline__ static void rescale(float (&o)[N], const float (&alpha)[2]) {
#pragma unroll
    for (int j = 0; j < N / 4; ++j) {
      o[4 * j] *= alpha[0];
      o[4 * j + 1] *= alpha[0];
      o[4 * j + 2] *= alpha[1];
      o[4 * j + 3] *= alpha[1];
    }
  }

  // The whole row's sum (over the quad that shares the row).
  __device__ __forceinline__ float total(int half) const { return tile::quad_sum(row_sum[half]); }
  // Natural-log LSE of a row whose total is l: -inf when it saw no key.
  __device__ __forceinline__ float lse(int half, float l) const {
    return l > 0.f ? (row_max[half] * scale_log2 + __log2f(l)) * tile::kLn2 : -INFINITY;
  }
};

}  // namespace ringtrain::attention::cuda
