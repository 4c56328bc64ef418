// Tensor views (pointer + dtype + device + shape + strides in elements) and an owning Tensor.
// Up to 4 dimensions: attention works on [B, S, H, D] (BSHD) and [T, H, D] (packed THD);
// other layouts (BHSD) are the same view with other strides.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "ringtrain/core/dtype.h"

namespace ringtrain {

enum class DeviceKind : uint8_t { CPU, CUDA };

struct Device {
  DeviceKind kind = DeviceKind::CPU;
  int index = 0;
  static Device cpu() { return {DeviceKind::CPU, 0}; }
  static Device cuda(int i = 0) { return {DeviceKind::CUDA, i}; }
  bool is_cpu() const { return kind == DeviceKind::CPU; }
  bool is_cuda() const { return kind == DeviceKind::CUDA; }
  bool operator==(const Device&) const = default;
};
std::string device_name(Device d);
Device parse_device(const std::string& name);  // "cpu", "cuda", "cuda:1"

constexpr int kMaxDims = 4;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::F32;
  Device device;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> stride{};  // in elements

  int64_t numel() const;
  int64_t size(int d) const { return shape[d < 0 ? d + ndim : d]; }
  bool is_contiguous() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  // Elements [start, start + len) of dimension d; no copy.
  TensorView slice(int d, int64_t start, int64_t len) const;
  // Byte address of the element at a multi-index.
  void* at(std::initializer_list<int64_t> idx) const;
  template <typename T>
  T* ptr() const { return static_cast<T*>(data); }
  std::string shape_str() const;  // "[2, 128, 8, 64] bf16 cpu"
};

// A contiguous view over existing memory.
TensorView contiguous_view(void* data, DType dtype, Device device, std::initializer_list<int64_t> shape);

// Owns its memory (host, or device when built with CUDA).
class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(std::initializer_list<int64_t> shape, DType dtype, Device device = Device::cpu());
  static Tensor zeros(std::initializer_list<int64_t> shape, DType dtype, Device device = Device::cpu());
  // False for a default-constructed Tensor, which owns nothing (its view is a 0-d shape of one element).
  bool defined() const { return storage_ != nullptr; }
  const TensorView& view() const { return view_; }
  operator const TensorView&() const { return view_; }  // NOLINT: a Tensor is usable wherever a view is
  void* data() const { return view_.data; }
  template <typename T>
  T* ptr() const { return view_.ptr<T>(); }
  int64_t numel() const { return view_.numel(); }
  size_t nbytes() const { return view_.nbytes(); }
  DType dtype() const { return view_.dtype; }
  int64_t size(int d) const { return view_.size(d); }

 private:
  std::shared_ptr<void> storage_;
  TensorView view_;
};

// Calls f(offset_a, offset_b) (in elements) for every multi-index of a's shape; b must have a's shape.
template <typename F>
void for_each_offset(const TensorView& a, const TensorView& b, F&& f) {
  std::array<int64_t, kMaxDims> idx{};
  const int64_t n = a.numel();
  for (int64_t k = 0; k < n; ++k) {
    int64_t oa = 0, ob = 0;
    for (int d = 0; d < a.ndim; ++d) {
      oa += idx[d] * a.stride[d];
      ob += idx[d] * b.stride[d];
    }
    f(oa, ob);
    for (int d = a.ndim - 1; d >= 0; --d) {
      if (++idx[d] < a.shape[d]) break;
      idx[d] = 0;
    }
  }
}

// Copies between views of the same shape: any strides, any dtypes, host or device memory (device memory in CUDA
// builds; two different GPUs only for contiguous views of one dtype). Complete when it returns.
void copy(const TensorView& dst, const TensorView& src);
// `bytes` raw bytes from src to dst, each on the host or a device (elements of any type, no alignment needed).
// Complete when it returns.
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
// Fills a host or device view with N(0, stddev) values computed from (seed, element index) by a counter-based hash,
// so the result does not depend on the device or on how the work is split (host and device agree up to float
// rounding). Complete when it returns.
void fill_normal_hashed(const TensorView& dst, uint64_t seed, double stddev = 1.0);
// Sets every element of a host or device view to value (zeroing buffers; poisoning outputs in tests). Complete when it
// returns.
void fill(const TensorView& dst, double value);

// Stream-ordered forms for the hot paths (CP steps, the GPU model): device views of one GPU are enqueued on
// `stream` (a cudaStream_t; nullptr = the legacy default stream) and not waited for; host views are done at once.
void copy_async(const TensorView& dst, const TensorView& src, void* stream);
void add_async(const TensorView& dst, const TensorView& src, void* stream);  // dst += src (float dtypes)
void fill_async(const TensorView& dst, double value, void* stream);

}  // namespace ringtrain
