#include "ringtrain/attention/cuda/convert.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "ringtrain/attention/cuda/cuda_util.h"

namespace ringtrain::attention::cuda {
namespace {

struct Shape4 {
  int64_t shape[4];
  int64_t dst_stride[4];
  int64_t src_stride[4];
};

__device__ inline float load_f(const float* p) { return *p; }
__device__ inline float load_f(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ inline float load_f(const __half* p) { return __half2float(*p); }
__device__ inline void store_f(float* p, float v) { *p = v; }
__device__ inline void store_f(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ inline void store_f(__half* p, float v) { *p = __float2half_rn(v); }

template <typename D, typename S>
__global__ void convert_kernel(D* dst, const S* src, Shape4 s, int64_t total, bool accumulate) {
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < total;
       idx += int64_t{gridDim.x} * blockDim.x) {
    int64_t rest = idx, od = 0, os = 0;
    for (int d = 3; d >= 0; --d) {
      const int64_t i = rest % s.shape[d];
      rest /= s.shape[d];
      od += i * s.dst_stride[d];
      os += i * s.src_stride[d];
    }
    const float v = load_f(src + os);
    store_f(dst + od, accumulate ? load_f(dst + od) + v : v);
  }
}

template <typename D, typename S>
void launch(cudaStream_t st, const TensorView& dst, const TensorView& src, const Shape4& s, int64_t total, bool acc) {
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((total + threads - 1) / threads, 65536 * 8);
  convert_kernel<<<static_cast<unsigned>(blocks), threads, 0, st>>>(static_cast<D*>(dst.data),
                                                                     static_cast<const S*>(src.data), s, total, acc);
}

template <typename D>
void launch_from(cudaStream_t st, const TensorView& dst, const TensorView& src, const Shape4& s, int64_t total,
                 bool acc) {
  switch (src.dtype) {
    case DType::F32: return launch<D, float>(st, dst, src, s, total, acc);
    case DType::BF16: return launch<D, __nv_bfloat16>(st, dst, src, s, total, acc);
    case DType::F16: return launch<D, __half>(st, dst, src, s, total, acc);
    default: throw Error(cat("convert_copy: unsupported source ", src.shape_str()));
  }
}

}  // namespace

void convert_copy(cudaStream_t stream, const TensorView& dst, const TensorView& src, bool accumulate) {
  RT_CHECK(dst.ndim == src.ndim && dst.ndim <= 4, "convert_copy: ", dst.shape_str(), " <- ", src.shape_str());
  Shape4 s{};
  const int pad = 4 - dst.ndim;  // leading dimensions of size 1
  for (int d = 0; d < 4; ++d) {
    s.shape[d] = d < pad ? 1 : dst.shape[d - pad];
    s.dst_stride[d] = d < pad ? 0 : dst.stride[d - pad];
    s.src_stride[d] = d < pad ? 0 : src.stride[d - pad];
    RT_CHECK(d < pad || dst.shape[d - pad] == src.shape[d - pad], "convert_copy: shape mismatch ", dst.shape_str(),
             " <- ", src.shape_str());
  }
  const int64_t total = dst.numel();
  if (total == 0) return;
  switch (dst.dtype) {
    case DType::F32: launch_from<float>(stream, dst, src, s, total, accumulate); break;
    case DType::BF16: launch_from<__nv_bfloat16>(stream, dst, src, s, total, accumulate); break;
    case DType::F16: launch_from<__half>(stream, dst, src, s, total, accumulate); break;
    default: throw Error(cat("convert_copy: unsupported destination ", dst.shape_str()));
  }
  check_launch("convert_kernel");
}

}  // namespace ringtrain::attention::cuda
