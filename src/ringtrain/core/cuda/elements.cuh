// Element i of a device buffer of any DType, read or written through fp64: the slow general path of kernels that take
// any dtype (integer and fp64 views in copies and fills; the loss inputs' gathers).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "ringtrain/core/dtype.h"

namespace ringtrain::cuda {

__device__ inline double load_any(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(p)[i];
    case DType::BF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::F16: return __half2float(static_cast<const __half*>(p)[i]);
    case DType::F64: return static_cast<const double*>(p)[i];
    case DType::I32: return static_cast<const int32_t*>(p)[i];
    case DType::I64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DType::U8: return static_cast<const uint8_t*>(p)[i];
  }
  return 0;
}

__device__ inline void store_any(void* p, DType t, int64_t i, double v) {
  switch (t) {
    case DType::F32: static_cast<float*>(p)[i] = static_cast<float>(v); return;
    case DType::BF16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(static_cast<float>(v)); return;
    case DType::F16: static_cast<__half*>(p)[i] = __float2half(static_cast<float>(v)); return;
    case DType::F64: static_cast<double*>(p)[i] = v; return;
    case DType::I32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); return;
    case DType::I64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); return;
    case DType::U8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v); return;
  }
}

}  // namespace ringtrain::cuda
