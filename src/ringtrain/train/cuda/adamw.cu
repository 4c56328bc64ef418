// Device AdamW and the gradient norm's sum of squares (train/device_optimizer.h; the sum is core/cuda/reduce.h's).
//
// Both are memory-bound. Bytes per parameter of one update: master fp32 read + write (8), exp_avg read + write (8),
// exp_avg_sq read + write (8), fp32 gradient read (4), bf16 compute weight write (2) = 30 B; at 1.24B parameters
// 37.2 GB, about 9-10 ms at the H200's ~4 TB/s of reachable HBM bandwidth. The sum of squares reads 4 B per element.
// Every thread handles groups of 4 consecutive elements with 16-byte loads and stores (8-byte for the bf16 output)
// when the pointers allow it and element-wise loads otherwise; the arithmetic and the summation order do not depend on
// which, so the results do not depend on the shard's alignment.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>

#include "ringtrain/core/cuda/check.h"
#include "ringtrain/core/cuda/reduce.h"
#include "ringtrain/train/cuda/adamw.h"

namespace ringtrain::train::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxUpdateBlocks = 8192;

template <bool kAligned>
__device__ inline float4 load4(const float* p, int64_t group) {
  if constexpr (kAligned) return reinterpret_cast<const float4*>(p)[group];
  const float* q = p + 4 * group;
  return make_float4(q[0], q[1], q[2], q[3]);
}

template <bool kAligned>
__device__ inline void store4(float* p, int64_t group, float4 v) {
  if constexpr (kAligned) {
    reinterpret_cast<float4*>(p)[group] = v;
  } else {
    float* q = p + 4 * group;
    q[0] = v.x, q[1] = v.y, q[2] = v.z, q[3] = v.w;
  }
}

using Scalars = AdamWScalars<float>;

// adamw_update<float>'s expression, one IEEE operation at a time: the _rn intrinsics keep nvcc from contracting
// a·b + c into an FMA (one rounding instead of two), which would break the bitwise equality with the host.
__device__ inline void adamw_element(float& p, float& m, float& v, float grad, const Scalars& s) {
  const float g = __fmul_rn(grad, s.clip);
  m = __fadd_rn(__fmul_rn(s.beta1, m), __fmul_rn(s.one_minus_beta1, g));
  v = __fadd_rn(__fmul_rn(s.beta2, v), __fmul_rn(s.one_minus_beta2, __fmul_rn(g, g)));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), s.bias_correction2_sqrt), s.eps);
  p = __fsub_rn(__fmul_rn(p, s.decay), __fmul_rn(s.step_size, __fdiv_rn(m, denom)));
}

__device__ inline uint16_t bf16_bits(float x) { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }

template <bool kAligned>
__global__ void adamw_kernel(DeviceAdamWShard shard, Scalars s) {
  const int64_t groups = shard.n / 4, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t g = tid; g < groups; g += stride) {
    float4 p = load4<kAligned>(shard.master, g), m = load4<kAligned>(shard.exp_avg, g);
    float4 v = load4<kAligned>(shard.exp_avg_sq, g);
    const float4 grad = load4<kAligned>(shard.grad, g);
    adamw_element(p.x, m.x, v.x, grad.x, s);
    adamw_element(p.y, m.y, v.y, grad.y, s);
    adamw_element(p.z, m.z, v.z, grad.z, s);
    adamw_element(p.w, m.w, v.w, grad.w, s);
    store4<kAligned>(shard.master, g, p);
    store4<kAligned>(shard.exp_avg, g, m);
    store4<kAligned>(shard.exp_avg_sq, g, v);
    if (shard.compute_bf16) {
      const ushort4 out = make_ushort4(bf16_bits(p.x), bf16_bits(p.y), bf16_bits(p.z), bf16_bits(p.w));
      if constexpr (kAligned) {
        reinterpret_cast<ushort4*>(shard.compute_bf16)[g] = out;
      } else {
        uint16_t* q = shard.compute_bf16 + 4 * g;
        q[0] = out.x, q[1] = out.y, q[2] = out.z, q[3] = out.w;
      }
    }
  }
  if (tid < shard.n - 4 * groups) {
    const int64_t i = 4 * groups + tid;
    float p = shard.master[i], m = shard.exp_avg[i], v = shard.exp_avg_sq[i];
    adamw_element(p, m, v, shard.grad[i], s);
    shard.master[i] = p, shard.exp_avg[i] = m, shard.exp_avg_sq[i] = v;
    if (shard.compute_bf16) shard.compute_bf16[i] = bf16_bits(p);
  }
}

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

int64_t blocks_for(int64_t n, int64_t cap) { return std::clamp<int64_t>((n / 4 + kThreads - 1) / kThreads, 1, cap); }

class CudaOptimizerKernels final : public DeviceOptimizerKernels {
 public:
  void sum_of_squares(const float* x, int64_t n, double* device_result, void* stream) const override {
    RT_CHECK(n >= 0 && (n == 0 || x) && device_result, "train sum_of_squares: bad arguments (n = ", n, ")");
    const auto st = static_cast<cudaStream_t>(stream);
    const int blocks = cuda_ops::sum_blocks_for(n);
    double* partial = nullptr;
    RT_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&partial), blocks * sizeof(double), st),
                  "train sum_of_squares: partial sums");
    cuda_ops::sum_of_squares(x, n, blocks, partial, device_result, stream);
    RT_CUDA_CHECK(cudaFreeAsync(partial, st), "train sum_of_squares: partial sums");
  }

  void adamw_update(const AdamWStep& step, const DeviceAdamWShard& shard, void* stream) const override {
    RT_CHECK(shard.n >= 0 && (shard.n == 0 || (shard.master && shard.exp_avg && shard.exp_avg_sq && shard.grad)),
             "train adamw_update: a null state pointer for a shard of ", shard.n, " elements");
    if (step.skipped || shard.n == 0) return;
    const Scalars s = adamw_scalars<float>(step);
    const auto st = static_cast<cudaStream_t>(stream);
    const int blocks = static_cast<int>(blocks_for(shard.n, kMaxUpdateBlocks));
    const bool vec = aligned(shard.master, 16) && aligned(shard.exp_avg, 16) && aligned(shard.exp_avg_sq, 16) &&
                     aligned(shard.grad, 16) && aligned(shard.compute_bf16, 8);
    if (vec)
      adamw_kernel<true><<<blocks, kThreads, 0, st>>>(shard, s);
    else
      adamw_kernel<false><<<blocks, kThreads, 0, st>>>(shard, s);
    RT_CUDA_CHECK_LAUNCH("train adamw_update (n = ", shard.n, ")");
  }
};

}  // namespace

const DeviceOptimizerKernels* optimizer_kernels() {
  static const CudaOptimizerKernels kernels;
  return &kernels;
}

}  // namespace ringtrain::train::cuda
