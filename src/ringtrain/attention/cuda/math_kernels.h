// Elementwise and row kernels of the GPU math backend. Dense scratch is fp32 [heads, rows, ld]; strided
// tensors are described by their [rows, heads, D] view (rows_view) and a first row.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ringtrain/attention/params.h"

namespace ringtrain::attention::cuda {

// A strided [rows, heads, D] tensor: element (r, h, c) at data + r*row_stride + h*head_stride + c.
struct Strided {
  void* data;
  DType dtype;
  int64_t row_stride, head_stride;
};
Strided strided(const TensorView& rows_view_3d);

// dst[h, r, c] = src(row0 + r, (head0 + h) / group, c) as fp32, for h < heads, r < n, c < d.
void gather_fp32(cudaStream_t s, const Strided& src, int64_t row0, int64_t n, int64_t head0, int64_t heads,
                 int64_t group, int64_t d, float* dst);
// dst(row0 + r, head0 + h, c) = (accumulate ? dst : 0) + src[h, r, c], converted to dst's dtype.
void scatter_fp32(cudaStream_t s, const float* src, int64_t row0, int64_t n, int64_t head0, int64_t heads, int64_t d,
                  const Strided& dst, bool accumulate);
// acc[kv, r, c] += sum of src[h - head0, r, c] over the query heads h in [head0, head0 + heads) with h / group == kv.
void add_group_sums(cudaStream_t s, const float* src, int64_t head0, int64_t heads, int64_t group, int64_t n, int64_t d,
                    float* acc);

// LSE element (head, row) of a call: data + head*head_stride + row*row_stride (fp32).
struct LseRef {
  float* data;
  int64_t head_stride, row_stride;
};

// scores[h, i, j] += bias(batch, head0 + h, i, j) for h < heads, i < sq, j < skv; bias is a broadcast view
// (attention::bias_broadcast_view) of any float dtype.
void add_bias(cudaStream_t s, float* scores, int64_t heads, int64_t sq, int64_t skv, int64_t ld,
              const TensorView& bias, int64_t batch, int64_t head0);

// Softmax over each row of scores [heads, sq, ld] (the first skv columns used) under the mask and sliding window
// (params.h; 0: none): P in place (masked entries 0) and lse(head0 + h, row0 + i). A row with no visible key gets
// LSE = -inf and P = 0.
void softmax_rows(cudaStream_t s, float* scores, int64_t heads, int64_t sq, int64_t skv, int64_t ld, MaskType mask,
                  int64_t window, LseRef lse, int64_t head0, int64_t row0);

// Backward rows: from scores S (scaled), dP = dO V^T, O and dO ([heads, sq, d]) and the forward LSE, writes
// P = exp(S - LSE) (masked 0) over S and dS = P * (dP - rowsum(dO * O)) over dP.
void backward_rows(cudaStream_t s, float* scores, float* dp, const float* o, const float* dout, int64_t heads,
                   int64_t sq, int64_t skv, int64_t ld, int64_t d, MaskType mask, int64_t window, LseRef lse,
                   int64_t head0, int64_t row0);

}  // namespace ringtrain::attention::cuda
