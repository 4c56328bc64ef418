#include <cuda_runtime.h>

#include <cstdint>

#include "ringtrain/core/cuda/check.h"
#include "ringtrain/core/cuda/float_convert.cuh"
#include "ringtrain/core/error.h"
#include "ringtrain/cp/cuda/merge.h"

namespace ringtrain::cp::cuda {
namespace {

using cuda_ops::from_float;
using cuda_ops::to_float;

template <typename T>
struct View4 {
  T* p;
  int64_t s[4];
};
struct View3 {
  float* p;
  int64_t s[3];
};

// Four consecutive elements, loaded and stored as one access.
template <typename T>
struct alignas(4 * sizeof(T)) Four {
  T v[4];
};

// One warp per (b, i, h) row: every lane reads the old LSEs, merges its share of D in fp32, then lane 0 writes the
// LSE. O of either side may be fp32, bf16 or fp16 (A, B). With kFours (both rows contiguous and aligned, D a
// multiple of 4) each lane moves four consecutive elements per access: the kernel is bound by memory, and the
// element-wise form reaches only about a third of the bandwidth.
template <typename A, typename B, bool kFours>
__global__ void merge_kernel(View4<A> oa, View3 la, View4<B> ob, View3 lb, int64_t batch, int64_t n, int64_t heads,
                             int64_t dim) {
  const int64_t row = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= batch * n * heads) return;
  const int64_t h = row % heads, i = (row / heads) % n, b = row / (heads * n);
  float* lse_a = la.p + b * la.s[0] + h * la.s[1] + i * la.s[2];
  const float l_a = *lse_a, l_b = lb.p[b * lb.s[0] + h * lb.s[1] + i * lb.s[2]];
  if (l_b == -INFINITY) return;  // b saw no key
  A* ra = oa.p + b * oa.s[0] + i * oa.s[1] + h * oa.s[2];
  const B* rb = ob.p + b * ob.s[0] + i * ob.s[1] + h * ob.s[2];
  // w = sigmoid(L_b - L_a) in a form that cannot overflow; a side at -inf gives w = 1.
  const float w = l_a == -INFINITY ? 1.f : (l_b >= l_a ? 1.f / (1.f + __expf(l_a - l_b))
                                                        : __expf(l_b - l_a) / (1.f + __expf(l_b - l_a)));
  if constexpr (kFours) {
    for (int64_t c = 4 * lane; c < dim; c += 128) {
      Four<A> x = *reinterpret_cast<const Four<A>*>(ra + c);
      const Four<B> y = *reinterpret_cast<const Four<B>*>(rb + c);
      for (int e = 0; e < 4; ++e) {
        const float xe = to_float(x.v[e]);
        x.v[e] = from_float<A>(xe - w * (xe - to_float(y.v[e])));
      }
      *reinterpret_cast<Four<A>*>(ra + c) = x;
    }
  } else {
    for (int64_t c = lane; c < dim; c += 32) {
      const float x = to_float(ra[c * oa.s[3]]);
      ra[c * oa.s[3]] = from_float<A>(x - w * (x - to_float(rb[c * ob.s[3]])));
    }
  }
  __syncwarp();
  if (lane == 0)
    *lse_a = l_a == -INFINITY ? l_b : fmaxf(l_a, l_b) + log1pf(__expf(-fabsf(l_a - l_b)));
}

template <typename T>
View4<T> v4(const TensorView& t) {
  return {static_cast<T*>(t.data), {t.stride[0], t.stride[1], t.stride[2], t.stride[3]}};
}
View3 v3(const TensorView& t) { return {t.ptr<float>(), {t.stride[0], t.stride[1], t.stride[2]}}; }

// Every row of `t` starts on a Four boundary and is contiguous, in whole Fours.
bool in_fours(const TensorView& t) {
  const int64_t align = 4 * static_cast<int64_t>(dtype_size(t.dtype));
  return t.stride[3] == 1 && t.shape[3] % 4 == 0 && t.stride[0] % 4 == 0 && t.stride[1] % 4 == 0 &&
         t.stride[2] % 4 == 0 && reinterpret_cast<uintptr_t>(t.data) % align == 0;
}

template <typename A, typename B>
void launch(const TensorView& o_a, const TensorView& lse_a, const TensorView& o_b, const TensorView& lse_b,
            cudaStream_t stream) {
  const int64_t batch = o_a.shape[0], n = o_a.shape[1], heads = o_a.shape[2], dim = o_a.shape[3];
  const int64_t threads = batch * n * heads * 32;
  if (threads == 0) return;
  const int block = 256;
  const unsigned blocks = static_cast<unsigned>((threads + block - 1) / block);
  if (in_fours(o_a) && in_fours(o_b))
    merge_kernel<A, B, true><<<blocks, block, 0, stream>>>(v4<A>(o_a), v3(lse_a), v4<B>(o_b), v3(lse_b), batch, n,
                                                           heads, dim);
  else
    merge_kernel<A, B, false><<<blocks, block, 0, stream>>>(v4<A>(o_a), v3(lse_a), v4<B>(o_b), v3(lse_b), batch, n,
                                                            heads, dim);
}

template <typename A>
void launch_b(const TensorView& o_a, const TensorView& lse_a, const TensorView& o_b, const TensorView& lse_b,
              cudaStream_t stream) {
  switch (o_b.dtype) {
    case DType::F32: return launch<A, float>(o_a, lse_a, o_b, lse_b, stream);
    case DType::BF16: return launch<A, __nv_bfloat16>(o_a, lse_a, o_b, lse_b, stream);
    case DType::F16: return launch<A, __half>(o_a, lse_a, o_b, lse_b, stream);
    default: throw Error(cat("CP merge: O of dtype ", dtype_name(o_b.dtype), " is not supported"));
  }
}

}  // namespace

void merge_partial(const TensorView& o_a, const TensorView& lse_a, const TensorView& o_b, const TensorView& lse_b,
                   void* stream) {
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  switch (o_a.dtype) {
    case DType::F32: launch_b<float>(o_a, lse_a, o_b, lse_b, st); break;
    case DType::BF16: launch_b<__nv_bfloat16>(o_a, lse_a, o_b, lse_b, st); break;
    case DType::F16: launch_b<__half>(o_a, lse_a, o_b, lse_b, st); break;
    default: throw Error(cat("CP merge: O of dtype ", dtype_name(o_a.dtype), " is not supported"));
  }
  RT_CUDA_CHECK_LAUNCH("the CP merge kernel for ", o_a.shape_str());
}

}  // namespace ringtrain::cp::cuda
