#include "ringtrain/core/device_info.h"

#include "ringtrain/core/error.h"

#ifdef RINGTRAIN_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ringtrain {

#ifdef RINGTRAIN_WITH_CUDA
int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

std::string cuda_unavailable_reason() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return cat("no usable CUDA device: ", cudaGetErrorString(e));
  }
  return n > 0 ? "" : "no CUDA device on this machine";
}

int cuda_arch(int device) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return major * 10 + minor;
}

void cuda_synchronize(int device) {
  int prev = 0;
  cudaGetDevice(&prev);
  cudaSetDevice(device);
  cudaError_t e = cudaDeviceSynchronize();
  cudaSetDevice(prev);
  RT_CHECK(e == cudaSuccess, "CUDA error on device ", device, ": ", cudaGetErrorString(e));
}

namespace {
cudaMemPool_t default_pool(int device) {
  cudaMemPool_t pool;
  const cudaError_t e = cudaDeviceGetDefaultMemPool(&pool, device);
  RT_CHECK(e == cudaSuccess, "CUDA device ", device, ": no default memory pool: ", cudaGetErrorString(e));
  return pool;
}
}  // namespace

uint64_t cuda_pool_peak_bytes(int device) {
  uint64_t v = 0;
  const cudaError_t e = cudaMemPoolGetAttribute(default_pool(device), cudaMemPoolAttrUsedMemHigh, &v);
  RT_CHECK(e == cudaSuccess, "CUDA device ", device, ": memory pool peak: ", cudaGetErrorString(e));
  return v;
}

void cuda_reset_pool_peak(int device) {
  uint64_t zero = 0;
  const cudaError_t e = cudaMemPoolSetAttribute(default_pool(device), cudaMemPoolAttrUsedMemHigh, &zero);
  RT_CHECK(e == cudaSuccess, "CUDA device ", device, ": resetting the memory pool peak: ", cudaGetErrorString(e));
}
#else
int cuda_device_count() { return 0; }
std::string cuda_unavailable_reason() { return "this build of ringtrain has no CUDA support"; }
int cuda_arch(int) { return 0; }
void cuda_synchronize(int) {}
uint64_t cuda_pool_peak_bytes(int) { return 0; }
void cuda_reset_pool_peak(int) {}
#endif

}  // namespace ringtrain
