// Element loads/stores of any supported dtype, for the `efficient` SIMT kernels and the backward's Delta step.
// (The bias lookup is in flash_tile.cuh, with the tensor-core variants.)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "ringtrain/attention/cuda/efficient_kernels.h"
#include "ringtrain/attention/cuda/flash_tile.cuh"

namespace ringtrain::attention::cuda::eff {

__device__ __forceinline__ float load_elem(const void* p, FlashElem e, int64_t i) {
  switch (e) {
    case FlashElem::BF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case FlashElem::F16: return __half2float(static_cast<const __half*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

// Stores (or adds, when accumulate: the tensor is then fp32) one value.
__device__ __forceinline__ void store_elem(void* p, FlashElem e, int64_t i, float v, bool accumulate) {
  switch (e) {
    case FlashElem::BF16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); break;
    case FlashElem::F16: static_cast<__half*>(p)[i] = __float2half_rn(v); break;
    default: {
      float* f = static_cast<float*>(p) + i;
      *f = accumulate ? *f + v : v;
    }
  }
}

}  // namespace ringtrain::attention::cuda::eff
