// Device conversions between the float dtypes and fp32, where every element-wise kernel does its arithmetic:
// to_float widens (double narrows), from_float<T> rounds to nearest even.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace ringtrain::cuda_ops {

__device__ inline float to_float(float x) { return x; }
__device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ inline float to_float(__half x) { return __half2float(x); }
__device__ inline float to_float(double x) { return static_cast<float>(x); }

template <typename T>
__device__ inline T from_float(float x);
template <>
__device__ inline float from_float<float>(float x) { return x; }
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ inline __half from_float<__half>(float x) { return __float2half_rn(x); }

}  // namespace ringtrain::cuda_ops
