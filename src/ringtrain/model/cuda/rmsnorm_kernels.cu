// RMSNorm over rows of the hidden state, one warp per row, statistics and arithmetic in fp32.
// Forward: y = w * (x * r), r = 1 / sqrt(mean(x^2) + eps), saved per row.
// Backward: with g = w * dy, dx = r * g - x * r^3 * mean(g * x); dw += dy * x * r summed over rows, first per warp
// in shared memory (each block walks many rows; a lane owns its columns within its warp's slice, so no atomics, and
// the slice is laid out [V][dim / V] so that a warp's 32 lanes hit 32 banks), then summed over the block's warps and
// added with one fp32 atomic per column per block. Rows too wide for a slice per warp share one slice (atomics).
#include <algorithm>

#include "ringtrain/model/cuda/kernel_util.cuh"
#include "ringtrain/model/cuda/layer_kernels.h"

namespace ringtrain::model::cuda {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;

template <int V>
__global__ void rmsnorm_forward_kernel(bf16* y, float* rstd, const bf16* x, const bf16* w, int64_t rows, int64_t dim,
                                       float eps) {
  const int lane = threadIdx.x % 32;
  for (int64_t row = blockIdx.x * int64_t{kWarps} + threadIdx.x / 32; row < rows; row += int64_t{gridDim.x} * kWarps) {
    const bf16* xr = x + row * dim;
    float sum_sq = 0.f;
    for (int64_t c = lane * V; c < dim; c += 32 * V) {
      float v[V];
      load_bf16<V>(xr + c, v);
#pragma unroll
      for (int i = 0; i < V; ++i) sum_sq += v[i] * v[i];
    }
    const float r = 1.f / sqrtf(warp_sum(sum_sq) / static_cast<float>(dim) + eps);
    if (lane == 0) rstd[row] = r;
    // The second read of the row hits L1: a warp's row was just loaded.
    for (int64_t c = lane * V; c < dim; c += 32 * V) {
      float v[V], wv[V];
      load_bf16<V>(xr + c, v);
      load_bf16<V>(w + c, wv);
#pragma unroll
      for (int i = 0; i < V; ++i) v[i] = wv[i] * (v[i] * r);
      store_bf16<V>(y + row * dim + c, v);
    }
  }
}

template <int V, bool kWarpSlices>
__global__ void rmsnorm_backward_kernel(bf16* dx, bool accumulate, float* dw, const bf16* dy, const bf16* x,
                                        const bf16* w, const float* rstd, int64_t rows, int64_t dim) {
  extern __shared__ float dw_block[];  // [kWarps][V][dim / V] with warp slices, else [dim]
  const int64_t slices = kWarpSlices ? kWarps : 1;
  for (int64_t j = threadIdx.x; j < slices * dim; j += kThreads) dw_block[j] = 0.f;
  __syncthreads();
  const int lane = threadIdx.x % 32;
  float* dw_warp = dw_block + (kWarpSlices ? (threadIdx.x / 32) * dim : 0);
  const int64_t stride_v = dim / V;
  for (int64_t row = blockIdx.x * int64_t{kWarps} + threadIdx.x / 32; row < rows; row += int64_t{gridDim.x} * kWarps) {
    const bf16 *xr = x + row * dim, *dyr = dy + row * dim;
    const float r = rstd[row];
    float dot = 0.f;  // sum of w * dy * x over the row
    for (int64_t c = lane * V; c < dim; c += 32 * V) {
      float xv[V], gv[V], wv[V];
      load_bf16<V>(xr + c, xv);
      load_bf16<V>(dyr + c, gv);
      load_bf16<V>(w + c, wv);
#pragma unroll
      for (int i = 0; i < V; ++i) dot += wv[i] * gv[i] * xv[i];
    }
    const float coef = r * r * r * warp_sum(dot) / static_cast<float>(dim);
    bf16* dxr = dx + row * dim;
    for (int64_t c = lane * V; c < dim; c += 32 * V) {
      float xv[V], gv[V], wv[V], out[V];
      load_bf16<V>(xr + c, xv);
      load_bf16<V>(dyr + c, gv);
      load_bf16<V>(w + c, wv);
      if (accumulate) {
        load_bf16<V>(dxr + c, out);
      } else {
#pragma unroll
        for (int i = 0; i < V; ++i) out[i] = 0.f;
      }
#pragma unroll
      for (int i = 0; i < V; ++i) {
        out[i] += r * wv[i] * gv[i] - coef * xv[i];
        if constexpr (kWarpSlices)
          dw_warp[i * stride_v + c / V] += gv[i] * xv[i] * r;
        else
          atomicAdd(&dw_block[c + i], gv[i] * xv[i] * r);
      }
      store_bf16<V>(dxr + c, out);
    }
  }
  __syncthreads();
  for (int64_t j = threadIdx.x; j < dim; j += kThreads) {
    float sum = 0.f;
    if constexpr (kWarpSlices) {
      for (int64_t s = 0; s < slices; ++s) sum += dw_block[s * dim + (j % V) * stride_v + j / V];
    } else {
      sum = dw_block[j];
    }
    atomicAdd(&dw[j], sum);
  }
}

// The backward's shared dw partial is dim floats; above the default 48 KiB a kernel must opt in.
template <int V, bool kWarpSlices>
void launch_backward(cudaStream_t s, unsigned blocks, bf16* dx, bool accumulate, float* dw, const bf16* dy,
                     const bf16* x, const bf16* w, const float* rstd, int64_t rows, int64_t dim) {
  const size_t shared = static_cast<size_t>(kWarpSlices ? kWarps : 1) * static_cast<size_t>(dim) * sizeof(float);
  if (shared > 48 * 1024) {
    RT_CUDA_CHECK(cudaFuncSetAttribute(rmsnorm_backward_kernel<V, kWarpSlices>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)),
                  "rmsnorm_backward: dim ", dim, " needs ", shared,
                  " bytes of shared memory for its weight-gradient partial");
  }
  rmsnorm_backward_kernel<V, kWarpSlices><<<blocks, kThreads, shared, s>>>(dx, accumulate, dw, dy, x, w, rstd, rows,
                                                                           dim);
}

// A slice per warp while it fits in shared memory (hidden sizes up to 6144), else one shared slice.
constexpr size_t kMaxSliceBytes = 192 * 1024;

// Blocks: as many as stay resident together (a few per multiprocessor, fewer when the slices are large), each
// walking many rows, so that the dw flush is paid rarely and no second wave of blocks runs alone.
template <int V>
void launch_backward(cudaStream_t s, bf16* dx, bool accumulate, float* dw, const bf16* dy, const bf16* x,
                     const bf16* w, const float* rstd, int64_t rows, int64_t dim) {
  const size_t slice_bytes = static_cast<size_t>(kWarps) * static_cast<size_t>(dim) * sizeof(float);
  const bool slices = slice_bytes <= kMaxSliceBytes;
  const int64_t per_sm = slices ? std::clamp<int64_t>(static_cast<int64_t>(kMaxSliceBytes / slice_bytes), 1, 4) : 4;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((rows + kWarps - 1) / kWarps, per_sm * sm_count()));
  if (slices)
    launch_backward<V, true>(s, blocks, dx, accumulate, dw, dy, x, w, rstd, rows, dim);
  else
    launch_backward<V, false>(s, blocks, dx, accumulate, dw, dy, x, w, rstd, rows, dim);
}

}  // namespace

void rmsnorm_forward(cudaStream_t s, bf16* y, float* rstd, const bf16* x, const bf16* w, int64_t rows, int64_t dim,
                     float eps) {
  if (rows == 0) return;
  RT_CHECK(dim > 0, "rmsnorm_forward: dim must be positive, got ", dim);
  const unsigned blocks = grid_for(rows, kWarps);
  if (dim % 8 == 0 && all_aligned(16, y, x, w)) {
    rmsnorm_forward_kernel<8><<<blocks, kThreads, 0, s>>>(y, rstd, x, w, rows, dim, eps);
  } else {
    rmsnorm_forward_kernel<1><<<blocks, kThreads, 0, s>>>(y, rstd, x, w, rows, dim, eps);
  }
  RT_CUDA_CHECK_LAUNCH("rmsnorm_forward_kernel ", "rows=", rows, " dim=", dim);
}

void rmsnorm_backward(cudaStream_t s, bf16* dx, bool accumulate, float* dw, const bf16* dy, const bf16* x,
                      const bf16* w, const float* rstd, int64_t rows, int64_t dim) {
  if (rows == 0) return;
  RT_CHECK(dim > 0, "rmsnorm_backward: dim must be positive, got ", dim);
  if (dim % 8 == 0 && all_aligned(16, dx, dy, x, w)) {
    launch_backward<8>(s, dx, accumulate, dw, dy, x, w, rstd, rows, dim);
  } else {
    launch_backward<1>(s, dx, accumulate, dw, dy, x, w, rstd, rows, dim);
  }
  RT_CUDA_CHECK_LAUNCH("rmsnorm_backward_kernel ", "rows=", rows, " dim=", dim);
}

}  // namespace ringtrain::model::cuda
