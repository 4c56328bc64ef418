#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "ringtrain/core/cuda/tensor_ops.h"
#include "ringtrain/core/error.h"
#include "ringtrain/core/hashed_normal.h"

namespace ringtrain::cuda_ops {
namespace {

struct Shape4 {
  int64_t shape[4];
  int64_t dst_stride[4];
  int64_t src_stride[4];
  int ndim;
};

__device__ double load(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(p)[i];
    case DType::BF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::F16: return __half2float(static_cast<const __half*>(p)[i]);
    case DType::F64: return static_cast<const double*>(p)[i];
    case DType::I32: return static_cast<const int32_t*>(p)[i];
    case DType::I64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
  }
  return 0;
}

__device__ void store(void* p, DType t, int64_t i, double v) {
  switch (t) {
    case DType::F32: static_cast<float*>(p)[i] = static_cast<float>(v); return;
    case DType::BF16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(static_cast<float>(v)); return;
    case DType::F16: static_cast<__half*>(p)[i] = __float2half(static_cast<float>(v)); return;
    case DType::F64: static_cast<double*>(p)[i] = v; return;
    case DType::I32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); return;
    case DType::I64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); return;
  }
}

// One thread per element; the multi-index is recovered from the linear index (row-major over the shape).
__global__ void strided_copy_kernel(void* dst, DType dt, const void* src, DType st, Shape4 s, int64_t n) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rest = k, od = 0, os = 0;
    for (int d = s.ndim - 1; d >= 0; --d) {
      const int64_t i = rest % s.shape[d];
      rest /= s.shape[d];
      od += i * s.dst_stride[d];
      os += i * s.src_stride[d];
    }
    store(dst, dt, od, load(src, st, os));
  }
}

__global__ void fill_normal_kernel(void* dst, DType dt, Shape4 s, int64_t n, uint64_t seed, double stddev) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rest = k, od = 0;
    for (int d = s.ndim - 1; d >= 0; --d) {
      od += (rest % s.shape[d]) * s.dst_stride[d];
      rest /= s.shape[d];
    }
    store(dst, dt, od, stddev * hashed_normal(seed, static_cast<uint64_t>(k)));
  }
}

Shape4 shape_of(const TensorView& dst, const TensorView& src) {
  Shape4 s{};
  s.ndim = dst.ndim;
  for (int d = 0; d < dst.ndim; ++d) {
    s.shape[d] = dst.shape[d];
    s.dst_stride[d] = dst.stride[d];
    s.src_stride[d] = src.stride[d];
  }
  return s;
}

void launch(const TensorView& dst, const TensorView& src, void* stream) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>((n + threads - 1) / threads, 65535 * 8));
  strided_copy_kernel<<<blocks, threads, 0, static_cast<cudaStream_t>(stream)>>>(dst.data, dst.dtype, src.data,
                                                                                  src.dtype, shape_of(dst, src), n);
  const cudaError_t e = cudaGetLastError();
  RT_CHECK(e == cudaSuccess, "strided copy kernel failed for ", dst.shape_str(), " <- ", src.shape_str(), ": ",
           cudaGetErrorString(e));
}

}  // namespace

void strided_copy(const TensorView& dst, const TensorView& src, void* stream) { launch(dst, src, stream); }

void fill_normal(const TensorView& dst, uint64_t seed, double stddev, void* stream) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>((n + threads - 1) / threads, 65535 * 8));
  fill_normal_kernel<<<blocks, threads, 0, static_cast<cudaStream_t>(stream)>>>(dst.data, dst.dtype,
                                                                                 shape_of(dst, dst), n, seed, stddev);
  const cudaError_t e = cudaGetLastError();
  RT_CHECK(e == cudaSuccess, "fill_normal kernel failed for ", dst.shape_str(), ": ", cudaGetErrorString(e));
}

void fill(const TensorView& dst, double value, void* stream) {
  // A one-element source broadcast by zero strides.
  double* one = nullptr;
  RT_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&one), sizeof(double), static_cast<cudaStream_t>(stream)) ==
               cudaSuccess, "fill: cudaMallocAsync failed");
  RT_CHECK(cudaMemcpyAsync(one, &value, sizeof(double), cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream)) ==
               cudaSuccess, "fill: cudaMemcpyAsync failed");
  TensorView src = dst;
  src.data = one;
  src.dtype = DType::F64;
  src.stride = {0, 0, 0, 0};
  launch(dst, src, stream);
  cudaFreeAsync(one, static_cast<cudaStream_t>(stream));
}

}  // namespace ringtrain::cuda_ops
