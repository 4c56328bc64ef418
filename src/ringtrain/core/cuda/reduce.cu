// The reductions of reduce.h. Memory-bound: 16-byte loads where the pointer allows, element-wise otherwise; the
// summation order is the same either way.
#include <cuda_runtime.h>

#include <algorithm>

#include "ringtrain/core/cuda/check.h"
#include "ringtrain/core/cuda/reduce.h"
#include "ringtrain/core/error.h"

namespace ringtrain::cuda_ops {
namespace {

constexpr int kThreads = 256;

// The block's kCount values (one per thread, in `sums`) into sums[0], by a fixed tree.
template <int kCount>
__device__ inline void block_tree_sum(double* sums) {
  __syncthreads();
  for (int half = kCount / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) sums[threadIdx.x] += sums[threadIdx.x + half];
    __syncthreads();
  }
}

template <bool kAligned>
__global__ void sum_of_squares_partial(const float* x, int64_t n, double* partial) {
  __shared__ double sums[kThreads];
  const int64_t groups = n / 4, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  double acc = 0;
  for (int64_t g = tid; g < groups; g += stride) {
    float4 v;
    if constexpr (kAligned) {
      v = reinterpret_cast<const float4*>(x)[g];
    } else {
      const float* q = x + 4 * g;
      v = make_float4(q[0], q[1], q[2], q[3]);
    }
    acc += static_cast<double>(v.x) * v.x;
    acc += static_cast<double>(v.y) * v.y;
    acc += static_cast<double>(v.z) * v.z;
    acc += static_cast<double>(v.w) * v.w;
  }
  if (tid < n - 4 * groups) acc += static_cast<double>(x[4 * groups + tid]) * x[4 * groups + tid];
  sums[threadIdx.x] = acc;
  block_tree_sum<kThreads>(sums);
  if (threadIdx.x == 0) partial[blockIdx.x] = sums[0];
}

__global__ void sum_kernel(const double* x, int n, double* result) {
  __shared__ double sums[kMaxSumBlocks];
  sums[threadIdx.x] = static_cast<int>(threadIdx.x) < n ? x[threadIdx.x] : 0.0;
  block_tree_sum<kMaxSumBlocks>(sums);
  if (threadIdx.x == 0) *result = sums[0];
}

}  // namespace

int sum_blocks_for(int64_t n, int cap) {
  RT_CHECK(n >= 0 && cap >= 1 && cap <= kMaxSumBlocks, "sum_blocks_for: bad arguments (n = ", n, ", cap = ", cap,
           ")");
  return static_cast<int>(std::clamp<int64_t>((n / 4 + kThreads - 1) / kThreads, 1, cap));
}

void sum_of_squares(const float* x, int64_t n, int blocks, double* partial, double* result, void* stream) {
  RT_CHECK(n >= 0 && (n == 0 || x) && partial && result && blocks >= 1 && blocks <= kMaxSumBlocks,
           "sum_of_squares: bad arguments (n = ", n, ", blocks = ", blocks, ")");
  const auto st = static_cast<cudaStream_t>(stream);
  if (reinterpret_cast<uintptr_t>(x) % 16 == 0)
    sum_of_squares_partial<true><<<blocks, kThreads, 0, st>>>(x, n, partial);
  else
    sum_of_squares_partial<false><<<blocks, kThreads, 0, st>>>(x, n, partial);
  RT_CUDA_CHECK_LAUNCH("sum_of_squares (n = ", n, ")");
  sum(partial, blocks, result, stream);
}

void sum(const double* x, int n, double* result, void* stream) {
  RT_CHECK(n >= 0 && n <= kMaxSumBlocks && (n == 0 || x) && result, "sum: bad arguments (n = ", n, ")");
  sum_kernel<<<1, kMaxSumBlocks, 0, static_cast<cudaStream_t>(stream)>>>(x, n, result);
  RT_CUDA_CHECK_LAUNCH("sum (n = ", n, ")");
}

}  // namespace ringtrain::cuda_ops
