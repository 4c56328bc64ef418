// Device helpers of the `efficient` kernels: element loads/stores of any supported dtype, the bias lookup, and the
// zero-padded tile copy of the tensor-core path.
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

// Offset of bias row (b, h, i); add j * col_stride for key j.
__device__ __forceinline__ int64_t bias_row_off(const EffBias& bias, int b, int h, int64_t i) {
  return b * bias.batch_stride + h * bias.head_stride + i * bias.row_stride;
}

__device__ __forceinline__ float load_bias(const EffBias& bias, int64_t off) {
  switch (bias.elem) {
    case BiasElem::BF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(bias.ptr)[off]);
    case BiasElem::F16: return __half2float(static_cast<const __half*>(bias.ptr)[off]);
    case BiasElem::F64: return static_cast<float>(static_cast<const double*>(bias.ptr)[off]);
    default: return static_cast<const float*>(bias.ptr)[off];
  }
}

// load_tile (flash_tile.cuh) for a tile whose real width is `chunks_valid` 16-byte chunks (head_dim / 8) out of
// COLS / 8: the chunks beyond are zero-filled, so a zero-padded head dimension adds nothing to any dot product.
template <int ROWS, int COLS, int NTHREADS>
__device__ __forceinline__ void load_tile_padded(uint32_t sdst, const uint16_t* g, int64_t row_stride, int rows_valid,
                                                 int chunks_valid) {
  constexpr int kChunks = COLS / 8;
  static_assert((ROWS * kChunks) % NTHREADS == 0, "tile copy must split evenly over the threads");
#pragma unroll
  for (int i = 0; i < ROWS * kChunks / NTHREADS; ++i) {
    const int idx = i * NTHREADS + static_cast<int>(threadIdx.x);
    const int r = idx / kChunks, c = idx % kChunks;
    const bool ok = r < rows_valid && c < chunks_valid;
    tile::cp_async16(sdst + tile::swz<COLS>(r, c), ok ? g + r * row_stride + c * 8 : g, ok);
  }
}

}  // namespace ringtrain::attention::cuda::eff
