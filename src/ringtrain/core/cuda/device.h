// The current CUDA device (CUDA builds only): a guard that makes one current, and its multiprocessor count.
#pragma once

#include <cuda_runtime_api.h>

#include "ringtrain/core/cuda/check.h"

namespace ringtrain::cuda {

// Makes `device` current for the lifetime of the guard.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    RT_CUDA_CHECK(cudaGetDevice(&prev_));
    if (prev_ != device) RT_CUDA_CHECK(cudaSetDevice(device));
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

// Streaming multiprocessors of the current device: sizes grids whose blocks each flush a partial reduction.
inline int sm_count() {
  int dev = 0, sms = 0;
  RT_CUDA_CHECK(cudaGetDevice(&dev));
  RT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "the multiprocessor count");
  return sms;
}

}  // namespace ringtrain::cuda
