// Small helpers for the GPU backends: stream-ordered scratch memory and the host copy of a packed call's cu_seqlens
// (the CUDA error checks and the device guard are core's, core/cuda/).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "ringtrain/attention/layout.h"
#include "ringtrain/core/cuda/check.h"
#include "ringtrain/core/cuda/device.h"

namespace ringtrain::attention::cuda {

using ringtrain::cuda::DeviceGuard;

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
    RT_CUDA_CHECK(cudaMallocAsync(&ptr_, bytes, stream), "allocating ", bytes, " bytes of scratch for ", what);
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
inline std::vector<Segment> device_segments(const AttnParams& p, const TensorView& cu_q, const TensorView& cu_kv,
                                            cudaStream_t stream) {
  if (!p.packed) return segments(p, cu_q, cu_kv);
  std::vector<int32_t> hq(static_cast<size_t>(p.batch + 1)), hk(static_cast<size_t>(p.batch + 1));
  RT_CUDA_CHECK(cudaMemcpyAsync(hq.data(), cu_q.data, hq.size() * 4, cudaMemcpyDefault, stream), "copying cu_seqlens_q");
  RT_CUDA_CHECK(cudaMemcpyAsync(hk.data(), cu_kv.data, hk.size() * 4, cudaMemcpyDefault, stream), "copying cu_seqlens_kv");
  RT_CUDA_CHECK(cudaStreamSynchronize(stream), "waiting for the cu_seqlens copy");
  TensorView vq = contiguous_view(hq.data(), DType::I32, Device::cpu(), {p.batch + 1});
  TensorView vk = contiguous_view(hk.data(), DType::I32, Device::cpu(), {p.batch + 1});
  return segments(p, vq, vk);
}

}  // namespace ringtrain::attention::cuda
