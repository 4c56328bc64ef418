#include "ringtrain/core/device_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "ringtrain/core/error.h"
#include "ringtrain/core/hashed_normal.h"
#include "ringtrain/core/parallel.h"

namespace ringtrain {
namespace {

// Host memory; the stream-ordered forms are done at once.
class HostDeviceOps final : public DeviceOps {
 public:
  DeviceKind kind() const override { return DeviceKind::CPU; }

  std::shared_ptr<void> allocate(const TensorView& like) const override {
    const size_t bytes = std::max<size_t>(like.nbytes(), 1);
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    RT_CHECK(p, "host allocation of ", bytes, " bytes failed for ", like.shape_str());
    return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  }

  std::shared_ptr<void> allocate_staging(size_t bytes) const override {
    void* p = std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64);
    RT_CHECK(p, "host allocation of ", bytes, " bytes failed");
    return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  }

  void copy(const TensorView& dst, const TensorView& src) const override {
    if (dst.dtype == src.dtype && dst.is_contiguous() && src.is_contiguous()) {
      std::memcpy(dst.data, src.data, dst.nbytes());
      return;
    }
    for_each_offset(dst, src, [&](int64_t od, int64_t os) {
      store_from_double(dst.data, dst.dtype, od, load_as_double(src.data, src.dtype, os));
    });
  }

  void copy_bytes(void* dst, const void* src, size_t bytes) const override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
  }

  void copy_async(const TensorView& dst, const TensorView& src, void*) const override { copy(dst, src); }

  void add_async(const TensorView& dst, const TensorView& src, void*) const override {
    for_each_offset(dst, src, [&](int64_t od, int64_t os) {
      store_from_double(dst.data, dst.dtype, od,
                        load_as_double(dst.data, dst.dtype, od) + load_as_double(src.data, src.dtype, os));
    });
  }

  void fill_async(const TensorView& dst, double value, void*) const override {
    if (value == 0.0 && !std::signbit(value) && dst.is_contiguous()) {  // all-zero bits are +0 in every dtype
      std::memset(dst.data, 0, dst.nbytes());
      return;
    }
    for_each_offset(dst, dst, [&](int64_t o, int64_t) { store_from_double(dst.data, dst.dtype, o, value); });
  }

  void fill_normal_hashed_async(const TensorView& dst, uint64_t seed, double stddev, void*) const override {
    if (dst.is_contiguous() && dst.dtype == DType::F32) {  // a model's weights: 1e9 draws, in blocks on every thread
      constexpr int64_t kBlock = int64_t{1} << 20;
      float* out = static_cast<float*>(dst.data);
      const int64_t n = dst.numel();
      parallel_for((n + kBlock - 1) / kBlock, [&](int64_t b) {
        for (int64_t k = b * kBlock; k < std::min(n, (b + 1) * kBlock); ++k)
          out[k] = static_cast<float>(stddev * hashed_normal(seed, static_cast<uint64_t>(k)));
      });
      return;
    }
    int64_t k = 0;  // row-major element number, the same numbering as the device kernel's
    for_each_offset(dst, dst, [&](int64_t o, int64_t) {
      store_from_double(dst.data, dst.dtype, o, stddev * hashed_normal(seed, static_cast<uint64_t>(k++)));
    });
  }

  int64_t first_outside(const TensorView& ids, const std::vector<int64_t>& lengths, int64_t limit) const override {
    check_row_lengths(ids, lengths);
    // Through fp64: an int64 beyond 2^53 rounds, but never across 0 or a limit that small.
    for (int64_t r = 0; r < ids.shape[0]; ++r)
      for (int64_t c = 0; c < lengths[static_cast<size_t>(r)]; ++c) {
        const double v = load_as_double(ids.data, ids.dtype, r * ids.stride[0] + c * ids.stride[1]);
        if (v < 0 || v >= static_cast<double>(limit)) return r * ids.shape[1] + c;
      }
    return -1;
  }

  void synchronize_stream(void*, const std::string&) const override {}
  int device_count() const override { return 1; }
  std::string unavailable_reason() const override { return ""; }
  int arch(int) const override { return 0; }
  void synchronize(int) const override {}
  uint64_t pool_peak_bytes(int) const override { return 0; }
  void reset_pool_peak(int) const override {}
};

}  // namespace

void check_row_lengths(const TensorView& ids, const std::vector<int64_t>& lengths) {
  RT_CHECK(ids.ndim == 2 && (ids.dtype == DType::I32 || ids.dtype == DType::I64),
           "token rows: expected a 2-D int32 or int64 view, got ", ids.shape_str());
  RT_CHECK(static_cast<int64_t>(lengths.size()) == ids.shape[0], "token rows: ", lengths.size(), " lengths for ",
           ids.shape[0], " rows");
  for (size_t r = 0; r < lengths.size(); ++r)
    RT_CHECK(lengths[r] >= 0 && lengths[r] <= ids.shape[1], "token rows: row ", r, " length ", lengths[r],
             " is outside [0, ", ids.shape[1], "]");
}

int64_t integer_at(const TensorView& ids, int64_t index) {
  const int64_t C = ids.shape[1];
  int64_t value = 0;
  copy(contiguous_view(&value, DType::I64, Device::cpu(), {1, 1}), ids.slice(0, index / C, 1).slice(1, index % C, 1));
  return value;
}

const DeviceOps& host_device_ops() {
  static const HostDeviceOps ops;
  return ops;
}

const DeviceOps* find_device_ops(DeviceKind kind) {
  static const DeviceOpsRegistry registry = [] {
    DeviceOpsRegistry r;
    register_device_ops(r);
    return r;
  }();
  return kind == DeviceKind::CPU ? registry.cpu : registry.cuda;
}

const DeviceOps& device_ops(const TensorView& view, const char* what) {
  if (const DeviceOps* ops = find_device_ops(view.device.kind)) return *ops;
  throw_no_device_ops(view.device, cat(what, " ", view.shape_str()));
}

void throw_no_device_ops(Device device, const std::string& what) {
  throw Error(cat(what, ": ", device_name(device), " memory, but this build of ringtrain has no ",
                  device.is_cuda() ? "CUDA" : device_name(device), " support"));
}

}  // namespace ringtrain
