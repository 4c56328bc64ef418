#include "ringtrain/core/tensor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>

#include "ringtrain/core/error.h"
#include "ringtrain/core/hashed_normal.h"

#ifdef RINGTRAIN_WITH_CUDA
#include <cuda_runtime_api.h>

#include "ringtrain/core/cuda/tensor_ops.h"
#endif

namespace ringtrain {

std::string device_name(Device d) {
  return d.is_cpu() ? std::string("cpu") : cat("cuda:", d.index);
}

Device parse_device(const std::string& name) {
  if (name == "cpu") return Device::cpu();
  if (name == "cuda" || name == "gpu") return Device::cuda(0);
  if (name.rfind("cuda:", 0) == 0) {
    try {
      return Device::cuda(std::stoi(name.substr(5)));
    } catch (const std::exception&) {
    }
  }
  throw Error(cat("unknown device '", name, "' (expected cpu, cuda or cuda:N)"));
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
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(nbytes, 1));
  if (device.is_cpu()) {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    RT_CHECK(p, "host allocation of ", bytes, " bytes failed for ", t.view_.shape_str());
    t.storage_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  } else {
#ifdef RINGTRAIN_WITH_CUDA
    // Stream-ordered allocation from the device's default pool, which keeps freed memory for reuse: CP and the
    // model allocate per step, and plain cudaMalloc/cudaFree would synchronize the device every time.
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(device.index);
    static std::once_flag pool_once[64];
    std::call_once(pool_once[device.index % 64], [&] {
      cudaMemPool_t pool;
      if (cudaDeviceGetDefaultMemPool(&pool, device.index) == cudaSuccess) {
        uint64_t keep = UINT64_MAX;
        cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
      }
    });
    void* p = nullptr;
    cudaError_t e = cudaMallocAsync(&p, bytes, nullptr);
    cudaSetDevice(prev);
    RT_CHECK(e == cudaSuccess, "GPU allocation of ", bytes, " bytes failed for ", t.view_.shape_str(), ": ",
             cudaGetErrorString(e));
    t.storage_ = std::shared_ptr<void>(p, [](void* q) { cudaFreeAsync(q, nullptr); });
#else
    throw Error(cat("cannot allocate ", t.view_.shape_str(), ": this build of ringtrain has no CUDA support"));
#endif
  }
  t.view_.data = t.storage_.get();
  return t;
}

Tensor Tensor::zeros(std::initializer_list<int64_t> shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  if (device.is_cpu()) {
    std::memset(t.data(), 0, t.nbytes());
  } else {
#ifdef RINGTRAIN_WITH_CUDA
    RT_CHECK(cudaMemset(t.data(), 0, t.nbytes()) == cudaSuccess, "cudaMemset failed for ", t.view_.shape_str());
#endif
  }
  return t;
}


#ifdef RINGTRAIN_WITH_CUDA
namespace {
void cuda_check(cudaError_t e, const char* what, const TensorView& dst, const TensorView& src) {
  RT_CHECK(e == cudaSuccess, what, " failed for ", dst.shape_str(), " <- ", src.shape_str(), ": ",
           cudaGetErrorString(e));
}

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
    cuda_check(cudaMemcpy(dst.data, src.data, dst.nbytes(), cudaMemcpyDefault), "cudaMemcpy", dst, src);
    return;
  }
  if (dst.device.is_cuda() && src.device.is_cuda()) {
    RT_CHECK(dst.device == src.device, "copy between two GPUs needs contiguous views of one dtype: ", dst.shape_str(),
             " <- ", src.shape_str());
    cuda_ops::strided_copy(dst, src, nullptr);
    cuda_check(cudaStreamSynchronize(nullptr), "strided copy", dst, src);
    return;
  }
  if (src.device.is_cpu()) {  // host -> device: pack on the host, upload, convert on the device
    Tensor packed = contiguous_like(src, Device::cpu());
    copy(contiguous_view_of(packed, src), src);
    Tensor up = contiguous_like(src, dst.device);
    cuda_check(cudaMemcpy(up.data(), packed.data(), src.nbytes(), cudaMemcpyHostToDevice), "upload", dst, src);
    copy_with_device(dst, contiguous_view_of(up, src));
  } else {  // device -> host: pack on the device, download, convert on the host
    Tensor packed = contiguous_like(src, src.device);
    copy_with_device(contiguous_view_of(packed, src), src);
    Tensor down = contiguous_like(src, Device::cpu());
    cuda_check(cudaMemcpy(down.data(), packed.data(), src.nbytes(), cudaMemcpyDeviceToHost), "download", dst, src);
    copy(dst, contiguous_view_of(down, src));
  }
}
}  // namespace
#endif

namespace {
void check_same_shape(const char* what, const TensorView& dst, const TensorView& src) {
  RT_CHECK(dst.ndim == src.ndim, what, ": rank mismatch ", dst.shape_str(), " <- ", src.shape_str());
  for (int d = 0; d < dst.ndim; ++d)
    RT_CHECK(dst.shape[d] == src.shape[d], what, ": shape mismatch ", dst.shape_str(), " <- ", src.shape_str());
}
}  // namespace

void copy(const TensorView& dst, const TensorView& src) {
  check_same_shape("copy", dst, src);
  if (dst.device.is_cpu() && src.device.is_cpu()) {
    if (dst.dtype == src.dtype && dst.is_contiguous() && src.is_contiguous()) {
      std::memcpy(dst.data, src.data, dst.nbytes());
      return;
    }
    for_each_offset(dst, src, [&](int64_t od, int64_t os) {
      store_from_double(dst.data, dst.dtype, od, load_as_double(src.data, src.dtype, os));
    });
    return;
  }
#ifdef RINGTRAIN_WITH_CUDA
  copy_with_device(dst, src);
#else
  throw Error(cat("copy: device memory in a build without CUDA: ", dst.shape_str(), " <- ", src.shape_str()));
#endif
}

void fill_normal_hashed(const TensorView& dst, uint64_t seed, double stddev) {
  if (dst.device.is_cpu()) {
    int64_t k = 0;  // row-major element number, the same numbering as the device kernel's
    for_each_offset(dst, dst, [&](int64_t o, int64_t) {
      store_from_double(dst.data, dst.dtype, o, stddev * hashed_normal(seed, static_cast<uint64_t>(k++)));
    });
    return;
  }
#ifdef RINGTRAIN_WITH_CUDA
  cuda_ops::fill_normal(dst, seed, stddev, nullptr);
  const cudaError_t e = cudaStreamSynchronize(nullptr);
  RT_CHECK(e == cudaSuccess, "fill_normal_hashed failed for ", dst.shape_str(), ": ", cudaGetErrorString(e));
#else
  throw Error(cat("fill_normal_hashed: device memory in a build without CUDA: ", dst.shape_str()));
#endif
}

void fill(const TensorView& dst, double value) {
  if (dst.device.is_cpu()) {
    for_each_offset(dst, dst, [&](int64_t o, int64_t) { store_from_double(dst.data, dst.dtype, o, value); });
    return;
  }
#ifdef RINGTRAIN_WITH_CUDA
  cuda_ops::fill(dst, value, nullptr);
  const cudaError_t e = cudaStreamSynchronize(nullptr);
  RT_CHECK(e == cudaSuccess, "fill failed for ", dst.shape_str(), ": ", cudaGetErrorString(e));
#else
  throw Error(cat("fill: device memory in a build without CUDA: ", dst.shape_str()));
#endif
}

namespace {
// Both on one GPU (true), both on the host (false), anything else an error naming the views.
bool on_one_gpu(const char* what, const TensorView& dst, const TensorView& src) {
  if (dst.device.is_cpu() && src.device.is_cpu()) return false;
  RT_CHECK(dst.device == src.device, what, ": views on different devices ", dst.shape_str(), " <- ", src.shape_str());
  return true;
}
}  // namespace

void copy_async(const TensorView& dst, const TensorView& src, void* stream) {
  if (!on_one_gpu("copy_async", dst, src)) return copy(dst, src);  // copy() checks the shapes
  check_same_shape("copy_async", dst, src);
#ifdef RINGTRAIN_WITH_CUDA
  cuda_ops::strided_copy(dst, src, stream, false);
#else
  (void)stream;
  throw Error(cat("device memory in a build without CUDA: ", dst.shape_str()));
#endif
}

void add_async(const TensorView& dst, const TensorView& src, void* stream) {
  check_same_shape("add_async", dst, src);
  if (!on_one_gpu("add_async", dst, src)) {
    for_each_offset(dst, src, [&](int64_t od, int64_t os) {
      store_from_double(dst.data, dst.dtype, od,
                        load_as_double(dst.data, dst.dtype, od) + load_as_double(src.data, src.dtype, os));
    });
    return;
  }
#ifdef RINGTRAIN_WITH_CUDA
  cuda_ops::strided_copy(dst, src, stream, true);
#else
  (void)stream;
  throw Error(cat("device memory in a build without CUDA: ", dst.shape_str()));
#endif
}

void fill_async(const TensorView& dst, double value, void* stream) {
  if (dst.device.is_cpu()) return fill(dst, value);
#ifdef RINGTRAIN_WITH_CUDA
  cuda_ops::fill(dst, value, stream);
#else
  (void)stream;
  throw Error(cat("device memory in a build without CUDA: ", dst.shape_str()));
#endif
}

}  // namespace ringtrain
