#include "ringtrain/core/cuda/cuda_device_ops.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <mutex>

#include "ringtrain/core/cuda/check.h"
#include "ringtrain/core/cuda/device.h"
#include "ringtrain/core/cuda/tensor_ops.h"
#include "ringtrain/core/error.h"

namespace ringtrain::cuda {
namespace {

// Storage for v's elements, contiguous, on `device` (viewed with v's shape through contiguous_view_of).
Tensor contiguous_like(const TensorView& v, Device device) { return Tensor::empty({v.numel()}, v.dtype, device); }

TensorView contiguous_view_of(const Tensor& t, const TensorView& like) {
  TensorView v = like;
  v.data = t.data();
  v.device = t.view().device;
  int64_t st = 1;
  for (int d = like.ndim - 1; d >= 0; --d) v.stride[d] = st, st *= like.shape[d];
  return v;
}

// Host <-> device or device <-> device with strides or a dtype change: stage through contiguous buffers so that
// the conversion runs on the device.
void copy_with_device(const TensorView& dst, const TensorView& src) {
  const bool same_layout = dst.dtype == src.dtype && dst.is_contiguous() && src.is_contiguous();
  if (same_layout) {
    RT_CUDA_CHECK(cudaMemcpy(dst.data, src.data, dst.nbytes(), cudaMemcpyDefault), "copy ", dst.shape_str(), " <- ",
                  src.shape_str());
    return;
  }
  if (dst.device.is_cuda() && src.device.is_cuda()) {
    RT_CHECK(dst.device == src.device, "copy between two GPUs needs contiguous views of one dtype: ", dst.shape_str(),
             " <- ", src.shape_str());
    cuda_ops::strided_copy(dst, src, nullptr);
    RT_CUDA_CHECK(cudaStreamSynchronize(nullptr), "strided copy ", dst.shape_str(), " <- ", src.shape_str());
    return;
  }
  if (src.device.is_cpu()) {  // host -> device: pack on the host (unless contiguous), upload, convert on the device
    Tensor packed;
    if (!src.is_contiguous()) {
      packed = contiguous_like(src, Device::cpu());
      copy(contiguous_view_of(packed, src), src);
    }
    Tensor up = contiguous_like(src, dst.device);
    RT_CUDA_CHECK(cudaMemcpy(up.data(), packed.defined() ? packed.data() : src.data, src.nbytes(),
                             cudaMemcpyHostToDevice),
                  "upload for ", dst.shape_str(), " <- ", src.shape_str());
    copy_with_device(dst, contiguous_view_of(up, src));
  } else {  // device -> host: pack on the device (unless contiguous), download, convert on the host
    Tensor packed;
    if (!src.is_contiguous()) {
      packed = contiguous_like(src, src.device);
      copy_with_device(contiguous_view_of(packed, src), src);
    }
    Tensor down = contiguous_like(src, Device::cpu());
    RT_CUDA_CHECK(cudaMemcpy(down.data(), packed.defined() ? packed.data() : src.data, src.nbytes(),
                             cudaMemcpyDeviceToHost),
                  "download for ", dst.shape_str(), " <- ", src.shape_str());
    copy(dst, contiguous_view_of(down, src));
  }
}

class CudaDeviceOps final : public DeviceOps {
 public:
  DeviceKind kind() const override { return DeviceKind::CUDA; }

  // Stream-ordered allocation from the device's default pool, which keeps freed memory for reuse: CP and the model
  // allocate per step, and plain cudaMalloc/cudaFree would synchronize the device every time.
  std::shared_ptr<void> allocate(const TensorView& like) const override {
    const size_t bytes = std::max<size_t>(like.nbytes(), 1);
    const int device = like.device.index;
    DeviceGuard guard(device);
    static std::once_flag pool_once[64];
    std::call_once(pool_once[device % 64], [&] {
      cudaMemPool_t pool;
      if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess) {
        uint64_t keep = UINT64_MAX;
        cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
      }
    });
    void* p = nullptr;
    RT_CUDA_CHECK(cudaMallocAsync(&p, bytes, nullptr), "GPU allocation of ", bytes, " bytes for ", like.shape_str());
    return std::shared_ptr<void>(p, [](void* q) { cudaFreeAsync(q, nullptr); });
  }

  std::shared_ptr<void> allocate_staging(size_t bytes) const override {
    void* p = nullptr;
    RT_CUDA_CHECK(cudaHostAlloc(&p, std::max<size_t>(bytes, 1), cudaHostAllocPortable),
                  "page-locked host allocation of ", bytes, " bytes");
    return std::shared_ptr<void>(p, [](void* q) { cudaFreeHost(q); });
  }

  void copy(const TensorView& dst, const TensorView& src) const override { copy_with_device(dst, src); }
  void copy_bytes(void* dst, const void* src, size_t bytes) const override {
    if (bytes > 0) RT_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "copy of ", bytes, " bytes");
  }

  void copy_async(const TensorView& dst, const TensorView& src, void* stream) const override {
    cuda_ops::strided_copy(dst, src, stream, false);
  }
  void add_async(const TensorView& dst, const TensorView& src, void* stream) const override {
    cuda_ops::strided_copy(dst, src, stream, true);
  }
  void fill_async(const TensorView& dst, double value, void* stream) const override {
    cuda_ops::fill(dst, value, stream);
  }
  void fill_normal_hashed_async(const TensorView& dst, uint64_t seed, double stddev, void* stream) const override {
    cuda_ops::fill_normal(dst, seed, stddev, stream);
  }
  int64_t first_outside(const TensorView& ids, const std::vector<int64_t>& lengths, int64_t limit) const override {
    check_row_lengths(ids, lengths);
    DeviceGuard guard(ids.device.index);
    return cuda_ops::first_outside(ids, lengths, limit);
  }
  void synchronize_stream(void* stream, const std::string& what) const override {
    RT_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), what);
  }

  int device_count() const override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky "no device" error
      return 0;
    }
    return n;
  }

  std::string unavailable_reason() const override {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return cat("no usable CUDA device: ", cudaGetErrorString(e));
    }
    return n > 0 ? "" : "no CUDA device on this machine";
  }

  int arch(int index) const override {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, index) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return major * 10 + minor;
  }

  void synchronize(int index) const override {
    DeviceGuard guard(index);
    RT_CUDA_CHECK(cudaDeviceSynchronize(), "waiting for cuda:", index);
  }

  uint64_t pool_peak_bytes(int index) const override {
    uint64_t bytes = 0;
    RT_CUDA_CHECK(cudaMemPoolGetAttribute(default_pool(index), cudaMemPoolAttrUsedMemHigh, &bytes),
                  "memory pool peak of cuda:", index);
    return bytes;
  }

  void reset_pool_peak(int index) const override {
    uint64_t zero = 0;
    RT_CUDA_CHECK(cudaMemPoolSetAttribute(default_pool(index), cudaMemPoolAttrUsedMemHigh, &zero),
                  "resetting the memory pool peak of cuda:", index);
  }

 private:
  static cudaMemPool_t default_pool(int index) {
    cudaMemPool_t pool;
    RT_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, index), "default memory pool of cuda:", index);
    return pool;
  }
};

}  // namespace

const DeviceOps& cuda_device_ops() {
  static const CudaDeviceOps ops;
  return ops;
}

}  // namespace ringtrain::cuda
