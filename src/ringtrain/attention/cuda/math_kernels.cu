#include "ringtrain/attention/cuda/math_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "ringtrain/attention/cuda/cuda_util.h"
#include "ringtrain/core/cuda/float_convert.cuh"

namespace ringtrain::attention::cuda {
namespace {

constexpr int kThreads = 256;

using ringtrain::cuda_ops::from_float;
using ringtrain::cuda_ops::to_float;

__device__ inline float block_sum(float v, float* shared) {
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // shared may still be read by a previous reduction
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < kThreads / 32; ++w) total += shared[w];
  return total;
}

// Combines running (max, sum of exp(x - max)) pairs.
__device__ inline void merge_max_sum(float& m, float& l, float m2, float l2) {
  const float mm = fmaxf(m, m2);
  if (mm == -INFINITY) return;  // both empty
  l = l * expf(m - mm) + l2 * expf(m2 - mm);
  m = mm;
}

template <typename T>
__global__ void gather_kernel(const T* src, int64_t row_stride, int64_t head_stride, int64_t row0, int64_t n,
                              int64_t head0, int64_t group, int64_t d, float* dst, int64_t total) {
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < total;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = idx % d, r = (idx / d) % n, h = idx / (d * n);
    dst[idx] = to_float(src[(row0 + r) * row_stride + ((head0 + h) / group) * head_stride + c]);
  }
}

template <typename T>
__global__ void scatter_kernel(const float* src, int64_t row0, int64_t n, int64_t head0, int64_t d, T* dst,
                               int64_t row_stride, int64_t head_stride, bool accumulate, int64_t total) {
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < total;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = idx % d, r = (idx / d) % n, h = idx / (d * n);
    T* out = dst + (row0 + r) * row_stride + (head0 + h) * head_stride + c;
    *out = from_float<T>((accumulate ? to_float(*out) : 0.f) + src[idx]);
  }
}

__global__ void group_sum_kernel(const float* src, int64_t head0, int64_t heads, int64_t group, int64_t kv_lo,
                                 int64_t nd, float* acc, int64_t total) {
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < total;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t kv = kv_lo + idx / nd, e = idx % nd;
    const int64_t h_begin = max(head0, kv * group), h_end = min(head0 + heads, (kv + 1) * group);
    float sum = 0.f;
    for (int64_t h = h_begin; h < h_end; ++h) sum += src[(h - head0) * nd + e];
    acc[kv * nd + e] += sum;
  }
}

__global__ void softmax_kernel(float* scores, int64_t sq, int64_t skv, int64_t ld, MaskType mask, int64_t window,
                               LseRef lse, int64_t head0, int64_t row0) {
  __shared__ float sm_m[kThreads / 32], sm_l[kThreads / 32];
  const int64_t row = blockIdx.x, h = row / sq, i = row % sq;
  float* s = scores + row * ld;
  const int64_t lim = key_limit(mask, i, sq, skv), first = key_start(mask, window, i, sq, skv);
  float m = -INFINITY, l = 0.f;
  for (int64_t j = first + threadIdx.x; j < lim; j += kThreads) merge_max_sum(m, l, s[j], 1.f);
  for (int off = 16; off > 0; off /= 2) merge_max_sum(m, l, __shfl_xor_sync(0xffffffffu, m, off),
                                                      __shfl_xor_sync(0xffffffffu, l, off));
  if (threadIdx.x % 32 == 0) {
    sm_m[threadIdx.x / 32] = m;
    sm_l[threadIdx.x / 32] = l;
  }
  __syncthreads();
  m = -INFINITY;
  l = 0.f;
  for (int w = 0; w < kThreads / 32; ++w) merge_max_sum(m, l, sm_m[w], sm_l[w]);
  // A row whose visible scores are all -inf (hidden by the bias) has l = 0: LSE = -inf and P = 0 like an empty row.
  const float row_lse = lim > first && l > 0.f ? m + logf(l) : -INFINITY;
  const int64_t p_lim = row_lse == -INFINITY ? 0 : lim;
  for (int64_t j = threadIdx.x; j < skv; j += kThreads) s[j] = j >= first && j < p_lim ? expf(s[j] - row_lse) : 0.f;
  if (threadIdx.x == 0) lse.data[(head0 + h) * lse.head_stride + (row0 + i) * lse.row_stride] = row_lse;
}

__global__ void backward_rows_kernel(float* scores, float* dp, const float* o, const float* dout, int64_t sq,
                                     int64_t skv, int64_t ld, int64_t d, MaskType mask, int64_t window, LseRef lse,
                                     int64_t head0, int64_t row0) {
  __shared__ float sm[kThreads / 32];
  const int64_t row = blockIdx.x, h = row / sq, i = row % sq;
  float partial = 0.f;
  for (int64_t c = threadIdx.x; c < d; c += kThreads) partial += o[row * d + c] * dout[row * d + c];
  const float di = block_sum(partial, sm);
  const float row_lse = lse.data[(head0 + h) * lse.head_stride + (row0 + i) * lse.row_stride];
  // A row that saw no key (LSE = -inf) has P = 0 and no gradient.
  const int64_t lim = row_lse == -INFINITY ? 0 : key_limit(mask, i, sq, skv);
  const int64_t first = key_start(mask, window, i, sq, skv);
  float* s = scores + row * ld;
  float* g = dp + row * ld;
  for (int64_t j = threadIdx.x; j < skv; j += kThreads) {
    const float p = j >= first && j < lim ? expf(s[j] - row_lse) : 0.f;
    s[j] = p;
    g[j] = p * (g[j] - di);
  }
}

// scores[h, i, j] += bias(batch, head0 + h, i, j) for the first skv columns (bias: broadcast view, see params.h).
template <typename T>
__global__ void add_bias_kernel(float* scores, int64_t sq, int64_t skv, int64_t ld, const T* bias, int64_t bias_base,
                                int64_t head_stride, int64_t row_stride, int64_t col_stride, int64_t head0,
                                int64_t total) {
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < total;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = idx % skv, i = (idx / skv) % sq, h = idx / (skv * sq);
    scores[(h * sq + i) * ld + j] +=
        to_float(bias[bias_base + (head0 + h) * head_stride + i * row_stride + j * col_stride]);
  }
}

unsigned grid_for(int64_t total) {
  const int64_t blocks = (total + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65536 * 16 ? (blocks > 0 ? blocks : 1) : 65536 * 16);
}

void check_rows(int64_t rows) {
  RT_CHECK(rows < (int64_t{1} << 31), "GPU math backend: ", rows, " score rows in one launch exceed the grid limit");
}

}  // namespace

Strided strided(const TensorView& v) {
  RT_CHECK(v.ndim == 3, "internal: expected a [rows, heads, D] view, got ", v.shape_str());
  return {v.data, v.dtype, v.stride[0], v.stride[1]};
}

void gather_fp32(cudaStream_t s, const Strided& src, int64_t row0, int64_t n, int64_t head0, int64_t heads,
                 int64_t group, int64_t d, float* dst) {
  const int64_t total = heads * n * d;
  if (total == 0) return;
  switch (src.dtype) {
    case DType::F32:
      gather_kernel<<<grid_for(total), kThreads, 0, s>>>(static_cast<const float*>(src.data), src.row_stride,
                                                         src.head_stride, row0, n, head0, group, d, dst, total);
      break;
    case DType::BF16:
      gather_kernel<<<grid_for(total), kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(src.data), src.row_stride,
                                                         src.head_stride, row0, n, head0, group, d, dst, total);
      break;
    case DType::F16:
      gather_kernel<<<grid_for(total), kThreads, 0, s>>>(static_cast<const __half*>(src.data), src.row_stride,
                                                         src.head_stride, row0, n, head0, group, d, dst, total);
      break;
    default: throw Error(cat("GPU math backend: cannot read ", dtype_name(src.dtype), " tensors"));
  }
  RT_CUDA_CHECK_LAUNCH("gather_kernel");
}

void scatter_fp32(cudaStream_t s, const float* src, int64_t row0, int64_t n, int64_t head0, int64_t heads, int64_t d,
                  const Strided& dst, bool accumulate) {
  const int64_t total = heads * n * d;
  if (total == 0) return;
  switch (dst.dtype) {
    case DType::F32:
      scatter_kernel<<<grid_for(total), kThreads, 0, s>>>(src, row0, n, head0, d, static_cast<float*>(dst.data),
                                                          dst.row_stride, dst.head_stride, accumulate, total);
      break;
    case DType::BF16:
      scatter_kernel<<<grid_for(total), kThreads, 0, s>>>(src, row0, n, head0, d, static_cast<__nv_bfloat16*>(dst.data),
                                                          dst.row_stride, dst.head_stride, accumulate, total);
      break;
    case DType::F16:
      scatter_kernel<<<grid_for(total), kThreads, 0, s>>>(src, row0, n, head0, d, static_cast<__half*>(dst.data),
                                                          dst.row_stride, dst.head_stride, accumulate, total);
      break;
    default: throw Error(cat("GPU math backend: cannot write ", dtype_name(dst.dtype), " tensors"));
  }
  RT_CUDA_CHECK_LAUNCH("scatter_kernel");
}

void add_group_sums(cudaStream_t s, const float* src, int64_t head0, int64_t heads, int64_t group, int64_t n, int64_t d,
                    float* acc) {
  const int64_t kv_lo = head0 / group, kv_hi = (head0 + heads - 1) / group;
  const int64_t total = (kv_hi - kv_lo + 1) * n * d;
  if (n * d == 0) return;
  group_sum_kernel<<<grid_for(total), kThreads, 0, s>>>(src, head0, heads, group, kv_lo, n * d, acc, total);
  RT_CUDA_CHECK_LAUNCH("group_sum_kernel");
}

void add_bias(cudaStream_t s, float* scores, int64_t heads, int64_t sq, int64_t skv, int64_t ld,
              const TensorView& bias, int64_t batch, int64_t head0) {
  const int64_t total = heads * sq * skv;
  if (total == 0) return;
  const int64_t base = batch * bias.stride[0];
  auto run = [&](auto* typed) {
    add_bias_kernel<<<grid_for(total), kThreads, 0, s>>>(scores, sq, skv, ld, typed, base, bias.stride[1],
                                                         bias.stride[2], bias.stride[3], head0, total);
  };
  switch (bias.dtype) {
    case DType::F32: run(static_cast<const float*>(bias.data)); break;
    case DType::BF16: run(static_cast<const __nv_bfloat16*>(bias.data)); break;
    case DType::F16: run(static_cast<const __half*>(bias.data)); break;
    case DType::F64: run(static_cast<const double*>(bias.data)); break;
    default: throw Error(cat("GPU math backend: cannot read a ", dtype_name(bias.dtype), " bias"));
  }
  RT_CUDA_CHECK_LAUNCH("add_bias_kernel");
}

void softmax_rows(cudaStream_t s, float* scores, int64_t heads, int64_t sq, int64_t skv, int64_t ld, MaskType mask,
                  int64_t window, LseRef lse, int64_t head0, int64_t row0) {
  const int64_t rows = heads * sq;
  if (rows == 0) return;
  check_rows(rows);
  softmax_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(scores, sq, skv, ld, mask, window, lse, head0,
                                                                  row0);
  RT_CUDA_CHECK_LAUNCH("softmax_kernel");
}

void backward_rows(cudaStream_t s, float* scores, float* dp, const float* o, const float* dout, int64_t heads,
                   int64_t sq, int64_t skv, int64_t ld, int64_t d, MaskType mask, int64_t window, LseRef lse,
                   int64_t head0, int64_t row0) {
  const int64_t rows = heads * sq;
  if (rows == 0) return;
  check_rows(rows);
  backward_rows_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(scores, dp, o, dout, sq, skv, ld, d, mask,
                                                                        window, lse, head0, row0);
  RT_CUDA_CHECK_LAUNCH("backward_rows_kernel");
}

}  // namespace ringtrain::attention::cuda
