// Helpers shared by the GPU model's small kernels: packs of V bf16 values moved as one load/store (V = 8: one
// 16-byte uint4; V = 4 (stores only): 8 bytes; V = 2: one bf16x2; V = 1: scalar), warp reductions and launch sizes
// (launch errors: RT_CUDA_CHECK_LAUNCH of core/cuda/check.h).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ringtrain/core/cuda/check.h"
#include "ringtrain/core/cuda/device.h"

namespace ringtrain::model::cuda {

using bf16 = __nv_bfloat16;

// Loads V consecutive bf16 values (address aligned to 2V bytes) as floats.
template <int V>
__device__ inline void load_bf16(const bf16* p, float (&out)[V]) {
  if constexpr (V == 8) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(h[i]);
      out[2 * i] = f.x, out[2 * i + 1] = f.y;
    }
  } else if constexpr (V == 2) {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
    out[0] = f.x, out[1] = f.y;
  } else {
    static_assert(V == 1, "packs of 1, 2 or 8 bf16");
    out[0] = __bfloat162float(*p);
  }
}

// Stores V floats rounded to bf16 (round to nearest even) at p (aligned to 2V bytes).
template <int V>
__device__ inline void store_bf16(bf16* p, const float (&v)[V]) {
  if constexpr (V == 8) {
    uint4 raw;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
    *reinterpret_cast<uint4*>(p) = raw;
  } else if constexpr (V == 4) {
    uint2 raw;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
    h[0] = __floats2bfloat162_rn(v[0], v[1]);
    h[1] = __floats2bfloat162_rn(v[2], v[3]);
    *reinterpret_cast<uint2*>(p) = raw;
  } else if constexpr (V == 2) {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(v[0], v[1]);
  } else {
    static_assert(V == 1, "packs of 1, 2, 4 or 8 bf16");
    *p = __float2bfloat16_rn(v[0]);
  }
}

__device__ inline float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ inline float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// True when every pointer is aligned to `bytes` (null pointers, for absent operands, count as aligned).
template <typename... P>
inline bool all_aligned(int bytes, const P*... ptrs) {
  return ((reinterpret_cast<uintptr_t>(ptrs) % bytes == 0) && ...);
}

// Blocks for a grid-stride loop over `items`: enough to fill the GPU a few times over, never more than needed.
inline unsigned grid_for(int64_t items, int threads) {
  constexpr int64_t kMaxBlocks = int64_t{1} << 20;
  const int64_t blocks = (items + threads - 1) / threads;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

using ringtrain::cuda::sm_count;

}  // namespace ringtrain::model::cuda
