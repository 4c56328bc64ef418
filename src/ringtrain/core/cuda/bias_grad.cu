// Column sums of dy [n, out] for the bias gradient. A block is 32 columns wide and 8 rows of threads deep; each
// thread sums every 8th row of the block's row range (a warp reads 32 adjacent columns of one row), the 8 partials
// are added in shared memory and the block adds its 32 sums into db with fp32 atomics.
#include <algorithm>

#include "ringtrain/core/cuda/bias_grad.cuh"
#include "ringtrain/core/cuda/check.h"
#include "ringtrain/core/cuda/device.h"

namespace ringtrain::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kCols = 32, kRowThreads = 8;

__global__ void bias_grad_kernel(float* db, const bf16* dy, int64_t n, int64_t out, int64_t rows_per_block) {
  __shared__ float partial[kRowThreads][kCols];
  const int64_t col = blockIdx.x * int64_t{kCols} + threadIdx.x;
  const int64_t row_begin = blockIdx.y * rows_per_block;
  const int64_t row_end = row_begin + rows_per_block < n ? row_begin + rows_per_block : n;
  float sum = 0.f;
  if (col < out) {
    // Unrolled so that each thread has several loads in flight: the kernel is bound by memory latency otherwise.
#pragma unroll 4
    for (int64_t r = row_begin + threadIdx.y; r < row_end; r += kRowThreads) sum += __bfloat162float(dy[r * out + col]);
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < out) {
    for (int i = 1; i < kRowThreads; ++i) sum += partial[i][threadIdx.x];
    atomicAdd(&db[col], sum);
  }
}

}  // namespace

void bias_grad_add(cudaStream_t s, float* db, const bf16* dy, int64_t n, int64_t out) {
  if (n == 0 || out == 0) return;
  const int64_t col_blocks = (out + kCols - 1) / kCols;
  // Enough row ranges to fill every multiprocessor (8 blocks of 8 warps each), each range at least 64 rows long.
  const int64_t wanted = std::max<int64_t>(1, int64_t{8} * sm_count() / col_blocks);
  const int64_t row_blocks = std::clamp<int64_t>((n + 63) / 64, 1, std::min<int64_t>(wanted, 65535));
  const int64_t rows_per_block = (n + row_blocks - 1) / row_blocks;
  RT_CHECK(col_blocks < (int64_t{1} << 31), "bias_grad_add: out=", out, " exceeds one grid");
  const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>((n + rows_per_block - 1) / rows_per_block));
  bias_grad_kernel<<<grid, dim3(kCols, kRowThreads), 0, s>>>(db, dy, n, out, rows_per_block);
  RT_CUDA_CHECK_LAUNCH("bias_grad_kernel ", "n=", n, " out=", out);
}

}  // namespace ringtrain::cuda
