#include "ringtrain/attention/cuda/random_fill.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "ringtrain/attention/cuda/cuda_util.h"

namespace ringtrain::attention::cuda {
namespace {

// splitmix64: a well-mixed 64-bit hash of (seed, index).
__device__ inline uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__device__ inline float normal_at(uint64_t seed, int64_t i) {
  const uint64_t r = mix(seed ^ mix(static_cast<uint64_t>(i)));
  const float u1 = (static_cast<float>(r >> 40) + 1.f) * (1.f / 16777216.f);  // (0, 1]
  const float u2 = static_cast<float>((r >> 16) & 0xffffff) * (1.f / 16777216.f);
  return sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);  // Box-Muller
}

__device__ inline void put(float* p, float v) { *p = v; }
__device__ inline void put(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ inline void put(__half* p, float v) { *p = __float2half_rn(v); }

template <typename T>
__global__ void fill_kernel(T* data, int64_t n, uint64_t seed, float stddev) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    put(data + i, stddev * normal_at(seed, i));
}

}  // namespace

void fill_normal_device(cudaStream_t stream, const TensorView& t, uint64_t seed, float stddev) {
  RT_CHECK(t.device.is_cuda() && t.is_contiguous(), "fill_normal_device: expected a contiguous device tensor, got ",
           t.shape_str());
  const int64_t n = t.numel();
  if (n == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 65536 * 4));
  switch (t.dtype) {
    case DType::F32: fill_kernel<<<blocks, 256, 0, stream>>>(static_cast<float*>(t.data), n, seed, stddev); break;
    case DType::BF16: fill_kernel<<<blocks, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(t.data), n, seed, stddev); break;
    case DType::F16: fill_kernel<<<blocks, 256, 0, stream>>>(static_cast<__half*>(t.data), n, seed, stddev); break;
    default: throw Error(cat("fill_normal_device: unsupported ", t.shape_str()));
  }
  check_launch("fill_kernel");
}

}  // namespace ringtrain::attention::cuda
