#include "ringtrain/core/tensor.h"

#include <algorithm>
#include <charconv>
#include <sstream>

#include "ringtrain/core/device_ops.h"
#include "ringtrain/core/error.h"

namespace ringtrain {

std::string device_name(Device d) {
  return d.is_cpu() ? std::string("cpu") : cat("cuda:", d.index);
}

Device parse_device(const std::string& name) {
  if (name == "cpu") return Device::cpu();
  if (name == "cuda" || name == "gpu") return Device::cuda(0);
  if (name.rfind("cuda:", 0) == 0) {
    int index = -1;
    const char* first = name.data() + 5;
    const char* last = name.data() + name.size();
    const auto [end, err] = std::from_chars(first, last, index);
    if (err == std::errc() && end == last && first != last && index >= 0 && index < 1024) return Device::cuda(index);
  }
  throw Error(cat("unknown device '", name, "' (expected cpu, cuda or cuda:N with N in [0, 1024))"));
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d)
    RT_CHECK(shape[d] >= 0 && !__builtin_mul_overflow(n, shape[d], &n), "tensor ", shape_str(),
             ": the element count is negative or overflows 64 bits");
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t expect = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    if (shape[d] != 1 && stride[d] != expect) return false;
    expect *= shape[d];
  }
  return true;
}

TensorView TensorView::slice(int d, int64_t start, int64_t len) const {
  if (d < 0) d += ndim;
  RT_CHECK(d >= 0 && d < ndim, "slice: dimension ", d, " out of range for ", shape_str());
  RT_CHECK(start >= 0 && len >= 0 && start + len <= shape[d], "slice: [", start, ", ", start + len,
           ") out of range for dimension ", d, " of ", shape_str());
  TensorView v = *this;
  v.shape[d] = len;
  v.data = static_cast<char*>(data) + start * stride[d] * static_cast<int64_t>(dtype_size(dtype));
  return v;
}

void* TensorView::at(std::initializer_list<int64_t> idx) const {
  int64_t off = 0;
  int d = 0;
  for (int64_t i : idx) off += i * stride[d++];
  return static_cast<char*>(data) + off * static_cast<int64_t>(dtype_size(dtype));
}

std::string TensorView::shape_str() const {
  std::ostringstream os;
  os << "[";
  for (int d = 0; d < ndim; ++d) os << (d ? ", " : "") << shape[d];
  os << "] " << dtype_name(dtype) << " " << device_name(device);
  return os.str();
}

TensorView contiguous_view(void* data, DType dtype, Device device, std::initializer_list<int64_t> shape) {
  RT_CHECK(shape.size() <= static_cast<size_t>(kMaxDims), "at most ", kMaxDims, " dimensions, got ", shape.size());
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.device = device;
  v.ndim = static_cast<int>(shape.size());
  int d = 0;
  for (int64_t s : shape) {
    RT_CHECK(s >= 0, "negative dimension ", s);
    v.shape[d++] = s;
  }
  int64_t st = 1;
  for (int i = v.ndim - 1; i >= 0; --i) {
    v.stride[i] = st;
    st *= v.shape[i];
  }
  return v;
}

Tensor Tensor::empty(std::initializer_list<int64_t> shape, DType dtype, Device device) {
  Tensor t;
  t.view_ = contiguous_view(nullptr, dtype, device, shape);
  int64_t nbytes = 0;
  RT_CHECK(!__builtin_mul_overflow(t.view_.numel(), static_cast<int64_t>(dtype_size(dtype)), &nbytes), "tensor ",
           t.view_.shape_str(), ": the byte size overflows 64 bits");
  t.storage_ = device_ops(t.view_, "allocating").allocate(t.view_);
  t.view_.data = t.storage_.get();
  return t;
}

Tensor Tensor::zeros(std::initializer_list<int64_t> shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  // Stream-ordered on the default stream, like the device's plain memset.
  device_ops(t.view_, "zeros").fill_async(t.view_, 0.0, nullptr);
  return t;
}

namespace {
void check_same_shape(const char* what, const TensorView& dst, const TensorView& src) {
  RT_CHECK(dst.ndim == src.ndim, what, ": rank mismatch ", dst.shape_str(), " <- ", src.shape_str());
  for (int d = 0; d < dst.ndim; ++d)
    RT_CHECK(dst.shape[d] == src.shape[d], what, ": shape mismatch ", dst.shape_str(), " <- ", src.shape_str());
}

// The table of a transfer between two devices: the host's when both are the host, else the device side's; `what`
// (called only on failure) describes the transfer.
template <typename What>
const DeviceOps& ops_between(Device dst, Device src, const What& what) {
  const Device d = dst.is_cpu() ? src : dst;
  if (const DeviceOps* ops = find_device_ops(d.kind)) return *ops;
  throw_no_device_ops(d, what());
}

const DeviceOps& ops_for(const char* what, const TensorView& dst, const TensorView& src) {
  return ops_between(dst.device, src.device, [&] { return cat(what, " ", dst.shape_str(), " <- ", src.shape_str()); });
}

// Both on the host, or both on one device (the stream-ordered forms); anything else an error naming the views.
const DeviceOps& ops_for_one_device(const char* what, const TensorView& dst, const TensorView& src) {
  RT_CHECK(dst.device == src.device, what, ": views on different devices ", dst.shape_str(), " <- ", src.shape_str());
  return ops_for(what, dst, src);
}
}  // namespace

void copy(const TensorView& dst, const TensorView& src) {
  check_same_shape("copy", dst, src);
  ops_for("copy", dst, src).copy(dst, src);
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  ops_between(dst_device, src_device, [&] { return cat("copy of ", bytes, " bytes"); }).copy_bytes(dst, src, bytes);
}

void fill_normal_hashed(const TensorView& dst, uint64_t seed, double stddev) {
  const DeviceOps& ops = device_ops(dst, "fill_normal_hashed");
  ops.fill_normal_hashed_async(dst, seed, stddev, nullptr);
  ops.synchronize_stream(nullptr, cat("fill_normal_hashed of ", dst.shape_str()));
}

void fill(const TensorView& dst, double value) {
  const DeviceOps& ops = device_ops(dst, "fill");
  ops.fill_async(dst, value, nullptr);
  ops.synchronize_stream(nullptr, cat("fill of ", dst.shape_str()));
}

void copy_async(const TensorView& dst, const TensorView& src, void* stream) {
  if (dst.device.is_cpu() && src.device.is_cpu()) return copy(dst, src);
  const DeviceOps& ops = ops_for_one_device("copy_async", dst, src);
  check_same_shape("copy_async", dst, src);
  ops.copy_async(dst, src, stream);
}

void add_async(const TensorView& dst, const TensorView& src, void* stream) {
  check_same_shape("add_async", dst, src);
  ops_for_one_device("add_async", dst, src).add_async(dst, src, stream);
}

void fill_async(const TensorView& dst, double value, void* stream) {
  device_ops(dst, "fill_async").fill_async(dst, value, stream);
}

}  // namespace ringtrain
