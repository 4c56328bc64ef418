// Small helpers for the GPU backends: CUDA error checks that name the call, the current-device guard,
// stream-ordered scratch memory, and the host copy of a packed call's cu_seqlens.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "ringtrain/attention/cpu/head_io.h"
#include "ringtrain/core/error.h"

#define RT_CUDA_CHECK(expr, what)                                                                     \
  do {                                                                                                \
    cudaError_t rt_cuda_err_ = (expr);                                                                \
    if (rt_cuda_err_ != cudaSuccess)                                                                  \
      throw ::ringtrain::Error(::ringtrain::cat(what, ": ", cudaGetErrorString(rt_cuda_err_), " (", #expr, ")")); \
  } while (0)

namespace ringtrain::attention::cuda {

// Makes `device` current for the lifetime of the guard.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    RT_CUDA_CHECK(cudaGetDevice(&prev_), "cudaGetDevice");
    if (prev_ != device) RT_CUDA_CHECK(cudaSetDevice(device), cat("cudaSetDevice(", device, ")"));
  }
  ~DeviceGuard() {
    int now = -1;
    if (cudaGetDevice(&now) == cudaSuccess && now != prev_) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
};

// Device memory ordered on a stream (cudaMallocAsync): cheap after the pool warms up and safe for
// concurrent calls on different streams. Freed on the same stream when the object dies.
// Keeps the current device's default pool from returning freed memory to the driver at every synchronisation,
// so that repeated calls reuse their scratch instead of mapping it again.
void keep_pool_memory();

class StreamScratch {
 public:
  StreamScratch(size_t bytes, cudaStream_t stream, const char* what) : stream_(stream) {
    if (bytes == 0) return;
    keep_pool_memory();
    RT_CUDA_CHECK(cudaMallocAsync(&ptr_, bytes, stream), cat("allocating ", bytes, " bytes of scratch for ", what));
  }
  ~StreamScratch() {
    if (ptr_) cudaFreeAsync(ptr_, stream_);
  }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  char* bytes() const { return static_cast<char*>(ptr_); }

 private:
  void* ptr_ = nullptr;
  cudaStream_t stream_;
};

// The sequences of a call; for packed calls cu_seqlens are copied to the host (the call waits for the stream).
inline std::vector<cpu::Segment> device_segments(const AttnParams& p, const TensorView& cu_q, const TensorView& cu_kv,
                                                 cudaStream_t stream) {
  if (!p.packed) return cpu::segments(p, cu_q, cu_kv);
  std::vector<int32_t> hq(static_cast<size_t>(p.batch + 1)), hk(static_cast<size_t>(p.batch + 1));
  RT_CUDA_CHECK(cudaMemcpyAsync(hq.data(), cu_q.data, hq.size() * 4, cudaMemcpyDefault, stream), "copying cu_seqlens_q");
  RT_CUDA_CHECK(cudaMemcpyAsync(hk.data(), cu_kv.data, hk.size() * 4, cudaMemcpyDefault, stream), "copying cu_seqlens_kv");
  RT_CUDA_CHECK(cudaStreamSynchronize(stream), "waiting for the cu_seqlens copy");
  TensorView vq = contiguous_view(hq.data(), DType::I32, Device::cpu(), {p.batch + 1});
  TensorView vk = contiguous_view(hk.data(), DType::I32, Device::cpu(), {p.batch + 1});
  return cpu::segments(p, vq, vk);
}

// The error of the last kernel launch, if any.
inline void check_launch(const char* kernel) { RT_CUDA_CHECK(cudaGetLastError(), cat("launching ", kernel)); }

}  // namespace ringtrain::attention::cuda
