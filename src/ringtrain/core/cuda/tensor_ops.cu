#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "ringtrain/core/cuda/check.h"
#include "ringtrain/core/cuda/elements.cuh"
#include "ringtrain/core/cuda/float_convert.cuh"
#include "ringtrain/core/cuda/tensor_ops.h"
#include "ringtrain/core/error.h"
#include "ringtrain/core/hashed_normal.h"

namespace ringtrain::cuda_ops {
namespace {

using cuda::load_any;
using cuda::store_any;

// A copy's index space after merging dimensions that are contiguous in both views (a contiguous view collapses to
// one dimension, so most copies need no index arithmetic at all).
struct Shape4 {
  int64_t shape[4];
  int64_t dst_stride[4];
  int64_t src_stride[4];
  int ndim;
};

Shape4 collapsed(const TensorView& dst, const TensorView& src) {
  Shape4 s{};
  for (int d = 0; d < dst.ndim; ++d) {
    if (dst.shape[d] == 1) continue;  // size-1 dimensions carry no offset
    if (s.ndim > 0) {
      const int l = s.ndim - 1;
      if (s.dst_stride[l] == dst.stride[d] * dst.shape[d] && s.src_stride[l] == src.stride[d] * dst.shape[d]) {
        s.shape[l] *= dst.shape[d];
        s.dst_stride[l] = dst.stride[d];
        s.src_stride[l] = src.stride[d];
        continue;
      }
    }
    s.shape[s.ndim] = dst.shape[d];
    s.dst_stride[s.ndim] = dst.stride[d];
    s.src_stride[s.ndim] = src.stride[d];
    ++s.ndim;
  }
  if (s.ndim == 0) s = Shape4{{1}, {1}, {1}, 1};
  return s;
}

__device__ inline void offsets(const Shape4& s, int64_t k, int64_t& od, int64_t& os) {
  od = 0, os = 0;
  for (int d = s.ndim - 1; d >= 0; --d) {
    const int64_t i = k % s.shape[d];
    k /= s.shape[d];
    od += i * s.dst_stride[d];
    os += i * s.src_stride[d];
  }
}

template <typename D, typename S, bool kAcc>
__device__ inline void move(D* dst, const S* src) {
  const float v = to_float(*src);
  *dst = from_float<D>(kAcc ? to_float(*dst) + v : v);
}

// Float views of any strides.
template <typename D, typename S, bool kAcc>
__global__ void strided_kernel(D* dst, const S* src, Shape4 s, int64_t n) {
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < n; k += int64_t{gridDim.x} * blockDim.x) {
    int64_t od, os;
    offsets(s, k, od, os);
    move<D, S, kAcc>(dst + od, src + os);
  }
}

// Contiguous float views: 8 elements per thread per iteration (16-byte loads of bf16/fp16, two of fp32).
template <typename D, typename S, bool kAcc>
__global__ void contiguous_kernel(D* __restrict__ dst, const S* __restrict__ src, int64_t n) {
  constexpr int kVec = 8;
  const int64_t groups = n / kVec;
  for (int64_t g = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; g < groups; g += int64_t{gridDim.x} * blockDim.x) {
    S in[kVec];
    D out[kVec];
    *reinterpret_cast<uint4*>(in) = reinterpret_cast<const uint4*>(src + g * kVec)[0];
    if constexpr (sizeof(S) == 4) *reinterpret_cast<uint4*>(in + 4) = reinterpret_cast<const uint4*>(src + g * kVec)[1];
    if constexpr (kAcc) {
      *reinterpret_cast<uint4*>(out) = reinterpret_cast<const uint4*>(dst + g * kVec)[0];
      if constexpr (sizeof(D) == 4)
        *reinterpret_cast<uint4*>(out + 4) = reinterpret_cast<const uint4*>(dst + g * kVec)[1];
    }
#pragma unroll
    for (int j = 0; j < kVec; ++j) out[j] = from_float<D>(kAcc ? to_float(out[j]) + to_float(in[j]) : to_float(in[j]));
    reinterpret_cast<uint4*>(dst + g * kVec)[0] = *reinterpret_cast<uint4*>(out);
    if constexpr (sizeof(D) == 4) reinterpret_cast<uint4*>(dst + g * kVec)[1] = *reinterpret_cast<uint4*>(out + 4);
  }
  // The tail (fewer than kVec elements), by the first threads of block 0.
  if (blockIdx.x == 0 && threadIdx.x < n - groups * kVec) {
    const int64_t i = groups * kVec + threadIdx.x;
    move<D, S, kAcc>(dst + i, src + i);
  }
}


__global__ void any_dtype_kernel(void* dst, DType dt, const void* src, DType st, Shape4 s, int64_t n, bool acc) {
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < n; k += int64_t{gridDim.x} * blockDim.x) {
    int64_t od, os;
    offsets(s, k, od, os);
    const double v = load_any(src, st, os);
    store_any(dst, dt, od, acc ? load_any(dst, dt, od) + v : v);
  }
}

__global__ void fill_normal_kernel(void* dst, DType dt, Shape4 s, int64_t n, uint64_t seed, double stddev) {
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < n; k += int64_t{gridDim.x} * blockDim.x) {
    int64_t od, unused;
    offsets(s, k, od, unused);
    store_any(dst, dt, od, stddev * hashed_normal(seed, static_cast<uint64_t>(k)));
  }
}

template <typename T>
__global__ void fill_kernel(T* dst, Shape4 s, int64_t n, float value) {
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < n; k += int64_t{gridDim.x} * blockDim.x) {
    int64_t od, unused;
    offsets(s, k, od, unused);
    dst[od] = from_float<T>(value);
  }
}

__global__ void fill_any_kernel(void* dst, DType dt, Shape4 s, int64_t n, double value) {
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < n; k += int64_t{gridDim.x} * blockDim.x) {
    int64_t od, unused;
    offsets(s, k, od, unused);
    store_any(dst, dt, od, value);
  }
}

// Every entry of row r's first lengths[r] columns outside [0, limit) lowers *first to its index r * cols + c.
template <typename T>
__global__ void first_outside_kernel(const T* ids, int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride,
                                     const int64_t* lengths, int64_t limit, unsigned long long* first) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    if (c >= lengths[r]) continue;
    const int64_t v = ids[r * row_stride + c * col_stride];
    if (v < 0 || v >= limit) atomicMin(first, static_cast<unsigned long long>(i));
  }
}

constexpr int kThreads = 256;
unsigned grid_for(int64_t work) {
  return static_cast<unsigned>(std::clamp<int64_t>((work + kThreads - 1) / kThreads, 1, 132 * 16));
}

void check(const char* what, const TensorView& dst) { RT_CUDA_CHECK_LAUNCH(what, " for ", dst.shape_str()); }

bool is_16_or_32_bit_float(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

template <typename D, typename S, bool kAcc>
void launch_typed(const TensorView& dst, const TensorView& src, const Shape4& s, int64_t n, cudaStream_t st) {
  auto* d = static_cast<D*>(dst.data);
  auto* p = static_cast<const S*>(src.data);
  const bool aligned = reinterpret_cast<uintptr_t>(d) % 16 == 0 && reinterpret_cast<uintptr_t>(p) % 16 == 0;
  if (s.ndim == 1 && s.dst_stride[0] == 1 && s.src_stride[0] == 1 && aligned)
    contiguous_kernel<D, S, kAcc><<<grid_for(n / 8 + 1), kThreads, 0, st>>>(d, p, n);
  else
    strided_kernel<D, S, kAcc><<<grid_for(n), kThreads, 0, st>>>(d, p, s, n);
}

template <typename D, typename S>
void launch_pair(const TensorView& dst, const TensorView& src, const Shape4& s, int64_t n, cudaStream_t st,
                 bool acc) {
  if (acc)
    launch_typed<D, S, true>(dst, src, s, n, st);
  else
    launch_typed<D, S, false>(dst, src, s, n, st);
}

template <typename D>
void launch_from(const TensorView& dst, const TensorView& src, const Shape4& s, int64_t n, cudaStream_t st,
                 bool acc) {
  switch (src.dtype) {
    case DType::F32: return launch_pair<D, float>(dst, src, s, n, st, acc);
    case DType::BF16: return launch_pair<D, __nv_bfloat16>(dst, src, s, n, st, acc);
    default: return launch_pair<D, __half>(dst, src, s, n, st, acc);
  }
}

}  // namespace

void strided_copy(const TensorView& dst, const TensorView& src, void* stream, bool accumulate) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  auto st = static_cast<cudaStream_t>(stream);
  const Shape4 s = collapsed(dst, src);
  const bool contiguous = s.ndim == 1 && s.dst_stride[0] == 1 && s.src_stride[0] == 1;
  if (!accumulate && contiguous && dst.dtype == src.dtype) {
    RT_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, dst.nbytes(), cudaMemcpyDeviceToDevice, st), "device copy ",
                  dst.shape_str(), " <- ", src.shape_str());
    return;
  }
  if (is_16_or_32_bit_float(dst.dtype) && is_16_or_32_bit_float(src.dtype)) {
    switch (dst.dtype) {
      case DType::F32: launch_from<float>(dst, src, s, n, st, accumulate); break;
      case DType::BF16: launch_from<__nv_bfloat16>(dst, src, s, n, st, accumulate); break;
      default: launch_from<__half>(dst, src, s, n, st, accumulate); break;
    }
  } else {
    any_dtype_kernel<<<grid_for(n), kThreads, 0, st>>>(dst.data, dst.dtype, src.data, src.dtype, s, n, accumulate);
  }
  check("device copy kernel", dst);
}

void fill_normal(const TensorView& dst, uint64_t seed, double stddev, void* stream) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  // Not collapsed: the element number k must be the row-major index over dst's own shape.
  Shape4 s{};
  s.ndim = dst.ndim;
  for (int d = 0; d < dst.ndim; ++d) s.shape[d] = dst.shape[d], s.dst_stride[d] = dst.stride[d];
  fill_normal_kernel<<<grid_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(dst.data, dst.dtype, s, n,
                                                                                        seed, stddev);
  check("fill_normal kernel", dst);
}

void fill(const TensorView& dst, double value, void* stream) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  auto st = static_cast<cudaStream_t>(stream);
  const Shape4 s = collapsed(dst, dst);
  if (value == 0.0 && s.ndim == 1 && s.dst_stride[0] == 1) {
    RT_CUDA_CHECK(cudaMemsetAsync(dst.data, 0, dst.nbytes(), st), "fill ", dst.shape_str());
    return;
  }
  const auto v = static_cast<float>(value);
  switch (dst.dtype) {
    case DType::F32: fill_kernel<<<grid_for(n), kThreads, 0, st>>>(dst.ptr<float>(), s, n, v); break;
    case DType::BF16: fill_kernel<<<grid_for(n), kThreads, 0, st>>>(dst.ptr<__nv_bfloat16>(), s, n, v); break;
    case DType::F16: fill_kernel<<<grid_for(n), kThreads, 0, st>>>(dst.ptr<__half>(), s, n, v); break;
    default: fill_any_kernel<<<grid_for(n), kThreads, 0, st>>>(dst.data, dst.dtype, s, n, value); break;
  }
  check("fill kernel", dst);
}

int64_t first_outside(const TensorView& ids, const std::vector<int64_t>& lengths, int64_t limit) {
  const int64_t rows = ids.shape[0], cols = ids.shape[1];
  if (rows * cols == 0) return -1;
  // The lengths in and the verdict out through one small buffer, on the legacy stream, which orders the ids'
  // producer (DLPack's stream handshake) before the kernel.
  const size_t len_bytes = lengths.size() * sizeof(int64_t);
  void* buf = nullptr;
  RT_CUDA_CHECK(cudaMallocAsync(&buf, len_bytes + sizeof(unsigned long long), nullptr), "token check buffer");
  auto* first = reinterpret_cast<unsigned long long*>(static_cast<char*>(buf) + len_bytes);
  unsigned long long result = ~0ull;
  cudaError_t err = cudaMemcpyAsync(buf, lengths.data(), len_bytes, cudaMemcpyHostToDevice, nullptr);
  if (err == cudaSuccess) err = cudaMemcpyAsync(first, &result, sizeof result, cudaMemcpyHostToDevice, nullptr);
  if (err == cudaSuccess) {
    const auto* len = static_cast<const int64_t*>(buf);
    const unsigned grid = grid_for(rows * cols);
    if (ids.dtype == DType::I32)
      first_outside_kernel<<<grid, kThreads>>>(ids.ptr<int32_t>(), rows, cols, ids.stride[0], ids.stride[1], len,
                                               limit, first);
    else
      first_outside_kernel<<<grid, kThreads>>>(ids.ptr<int64_t>(), rows, cols, ids.stride[0], ids.stride[1], len,
                                               limit, first);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) err = cudaMemcpyAsync(&result, first, sizeof result, cudaMemcpyDeviceToHost, nullptr);
  if (err == cudaSuccess) err = cudaStreamSynchronize(nullptr);
  cudaFreeAsync(buf, nullptr);
  RT_CUDA_CHECK(err, "checking the token ids of ", ids.shape_str());
  return result == ~0ull ? -1 : static_cast<int64_t>(result);
}

}  // namespace ringtrain::cuda_ops
