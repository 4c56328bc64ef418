// The bias gradient of a linear layer, beside its cuBLASLt GEMMs (gemm.cpp): plain C++ can include this header.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ringtrain::cuda {

// db[out] += sum over the n rows of dy[n, out], in fp32 (per-block column partials, then fp32 atomics).
void bias_grad_add(cudaStream_t s, float* db, const __nv_bfloat16* dy, int64_t n, int64_t out);

}  // namespace ringtrain::cuda
