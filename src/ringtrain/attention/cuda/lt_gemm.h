// Row-major fp32 strided-batched GEMM through cuBLASLt, in true fp32 (no TF32): the GPU math backend's
// matrix products. C[b] = alpha * op(A[b]) * op(B[b]) for b < batch, op = transpose when asked.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ringtrain::attention::cuda {

struct RowMajor {
  const float* data;
  int64_t ld;            // elements between rows as stored
  int64_t batch_stride;  // elements between batch entries
  bool transposed;       // use the stored matrix transposed
};

// C is [m, n] with row stride ldc. workspace: device memory of workspace_bytes (may be 0).
void lt_gemm(cudaStream_t stream, int64_t m, int64_t n, int64_t k, float alpha, RowMajor a, RowMajor b, float* c,
             int64_t ldc, int64_t c_batch_stride, int64_t batch, void* workspace, size_t workspace_bytes);

// Workspace the callers reserve for lt_gemm.
constexpr size_t kLtWorkspaceBytes = 32u << 20;

}  // namespace ringtrain::attention::cuda
