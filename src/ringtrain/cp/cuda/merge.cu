#include <cuda_runtime.h>

#include "ringtrain/core/error.h"
#include "ringtrain/cp/cuda/merge.h"

namespace ringtrain::cp::cuda {
namespace {

struct View4 {
  float* p;
  int64_t s[4];
};
struct View3 {
  float* p;
  int64_t s[3];
};

// One warp per (b, i, h) row: every lane reads the old LSEs, merges its share of D, then lane 0 writes the LSE.
__global__ void merge_kernel(View4 oa, View3 la, View4 ob, View3 lb, int64_t batch, int64_t n, int64_t heads,
                             int64_t dim) {
  const int64_t row = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= batch * n * heads) return;
  const int64_t h = row % heads, i = (row / heads) % n, b = row / (heads * n);
  float* lse_a = la.p + b * la.s[0] + h * la.s[1] + i * la.s[2];
  const float l_a = *lse_a, l_b = lb.p[b * lb.s[0] + h * lb.s[1] + i * lb.s[2]];
  if (l_b == -INFINITY) return;  // b saw no key
  float* ra = oa.p + b * oa.s[0] + i * oa.s[1] + h * oa.s[2];
  const float* rb = ob.p + b * ob.s[0] + i * ob.s[1] + h * ob.s[2];
  // w = sigmoid(L_b - L_a) in a form that cannot overflow; a side at -inf gives w = 1.
  const float w = l_a == -INFINITY ? 1.f : (l_b >= l_a ? 1.f / (1.f + __expf(l_a - l_b))
                                                        : __expf(l_b - l_a) / (1.f + __expf(l_b - l_a)));
  for (int64_t c = lane; c < dim; c += 32) {
    const float x = ra[c * oa.s[3]];
    ra[c * oa.s[3]] = x - w * (x - rb[c * ob.s[3]]);
  }
  __syncwarp();
  if (lane == 0)
    *lse_a = l_a == -INFINITY ? l_b : fmaxf(l_a, l_b) + log1pf(__expf(-fabsf(l_a - l_b)));
}

View4 v4(const TensorView& t) { return {t.ptr<float>(), {t.stride[0], t.stride[1], t.stride[2], t.stride[3]}}; }
View3 v3(const TensorView& t) { return {t.ptr<float>(), {t.stride[0], t.stride[1], t.stride[2]}}; }

}  // namespace

void merge_partial(const TensorView& o_a, const TensorView& lse_a, const TensorView& o_b, const TensorView& lse_b,
                   void* stream) {
  const int64_t batch = o_a.shape[0], n = o_a.shape[1], heads = o_a.shape[2], dim = o_a.shape[3];
  const int64_t threads = batch * n * heads * 32;
  if (threads == 0) return;
  const int block = 256;
  merge_kernel<<<static_cast<unsigned>((threads + block - 1) / block), block, 0, static_cast<cudaStream_t>(stream)>>>(v4(o_a), v3(lse_a), v4(o_b), v3(lse_b),
                                                                               batch, n, heads, dim);
  const cudaError_t e = cudaGetLastError();
  RT_CHECK(e == cudaSuccess, "CP merge kernel failed for ", o_a.shape_str(), ": ", cudaGetErrorString(e));
}

}  // namespace ringtrain::cp::cuda
