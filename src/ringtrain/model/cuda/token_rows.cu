#include "ringtrain/model/cuda/token_rows.h"

#include <algorithm>

#include "ringtrain/core/cuda/check.h"

namespace ringtrain::model::cuda {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535));
}

template <typename T>
__global__ void gather_kernel(const T* ids, const int64_t* token_offset, const int64_t* target_offset, int32_t* tokens,
                              int32_t* targets, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = token_offset[i], g = target_offset[i];
    tokens[i] = t < 0 ? 0 : static_cast<int32_t>(ids[t]);
    targets[i] = g < 0 ? -1 : static_cast<int32_t>(ids[g]);
  }
}

__global__ void scatter_kernel(float* dst, const float* src, const int64_t* offset, int64_t n, int64_t total,
                               int64_t block_stride) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < total; j += int64_t(gridDim.x) * blockDim.x) {
    const int64_t o = offset[j];
    if (o >= 0) dst[o] = src[(j / n) * block_stride + j % n];
  }
}

__global__ void gather_values_kernel(float* dst, const float* src, const int64_t* offset, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t o = offset[i];
    dst[i] = o < 0 ? 0.f : src[o];
  }
}

}  // namespace

void gather_token_rows(const void* ids, DType dtype, const int64_t* token_offset, const int64_t* target_offset,
                       int32_t* tokens, int32_t* targets, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  if (dtype == DType::I32)
    gather_kernel<<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const int32_t*>(ids), token_offset, target_offset,
                                                          tokens, targets, n);
  else
    gather_kernel<<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const int64_t*>(ids), token_offset, target_offset,
                                                          tokens, targets, n);
  RT_CUDA_CHECK_LAUNCH("token row gather of ", n, " rows");
}

void scatter_row_results(float* dst, const float* src, const int64_t* offset, int64_t n, int64_t blocks,
                         int64_t block_stride, cudaStream_t stream) {
  const int64_t total = n * blocks;
  if (total == 0) return;
  scatter_kernel<<<blocks_for(total), kThreads, 0, stream>>>(dst, src, offset, n, total, block_stride);
  RT_CUDA_CHECK_LAUNCH("row result scatter of ", total, " entries");
}

void gather_row_values(float* dst, const float* src, const int64_t* offset, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  gather_values_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dst, src, offset, n);
  RT_CUDA_CHECK_LAUNCH("row value gather of ", n, " rows");
}

}  // namespace ringtrain::model::cuda
