// The element-wise layers of the GPU model: embedding lookup and SwiGLU (the residual add is the GEMMs' C operand,
// gemm.h). All are memory-bound: each thread moves one pack of 8 bf16 (16 bytes) when the row length and every
// pointer allow it, else one value.
#include "ringtrain/model/cuda/kernel_util.cuh"
#include "ringtrain/model/cuda/layer_kernels.h"

namespace ringtrain::model::cuda {
namespace {

constexpr int kThreads = 256;

// Rows of `dim` values can move in packs of 8 when dim % 8 == 0 and the bases are 16-byte aligned.
template <typename... P>
bool packs_of_8(int64_t dim, const P*... ptrs) {
  return dim % 8 == 0 && all_aligned(16, ptrs...);
}

template <int V>
__global__ void embedding_forward_kernel(bf16* x, const int32_t* tokens, const bf16* table, int64_t n, int64_t dim) {
  const int64_t packs_per_row = dim / V, total = n * packs_per_row;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = e / packs_per_row, col = (e % packs_per_row) * V;
    const bf16* src = table + int64_t{tokens[row]} * dim + col;
    bf16* dst = x + row * dim + col;
    if constexpr (V == 8) {
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
    } else {
      *dst = *src;
    }
  }
}

template <int V>
__global__ void embedding_backward_kernel(float* dtable, const int32_t* tokens, const bf16* dx, int64_t n,
                                          int64_t dim) {
  const int64_t packs_per_row = dim / V, total = n * packs_per_row;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = e / packs_per_row, col = (e % packs_per_row) * V;
    float g[V];
    load_bf16<V>(dx + row * dim + col, g);
    float* dst = dtable + int64_t{tokens[row]} * dim + col;
#pragma unroll
    for (int i = 0; i < V; ++i) atomicAdd(dst + i, g[i]);
  }
}

__device__ inline float sigmoid(float g) { return 1.f / (1.f + expf(-g)); }

template <int V>
__global__ void swiglu_forward_kernel(bf16* h, const bf16* gate_up, int64_t n, int64_t ffn) {
  const int64_t packs_per_row = ffn / V, total = n * packs_per_row;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = e / packs_per_row, col = (e % packs_per_row) * V;
    const bf16* gate = gate_up + row * 2 * ffn + col;
    float g[V], u[V], out[V];
    load_bf16<V>(gate, g);
    load_bf16<V>(gate + ffn, u);
#pragma unroll
    for (int i = 0; i < V; ++i) out[i] = g[i] * sigmoid(g[i]) * u[i];
    store_bf16<V>(h + row * ffn + col, out);
  }
}

// silu'(g) = sig(g) * (1 + g * (1 - sig(g))).
template <int V>
__global__ void swiglu_backward_kernel(bf16* dgate_up, const bf16* dh, const bf16* gate_up, int64_t n, int64_t ffn) {
  const int64_t packs_per_row = ffn / V, total = n * packs_per_row;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = e / packs_per_row, col = (e % packs_per_row) * V;
    const int64_t gate_at = row * 2 * ffn + col;
    float g[V], u[V], d[V], dgate[V], dup[V];
    load_bf16<V>(gate_up + gate_at, g);
    load_bf16<V>(gate_up + gate_at + ffn, u);
    load_bf16<V>(dh + row * ffn + col, d);
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const float sig = sigmoid(g[i]);
      dup[i] = d[i] * g[i] * sig;
      dgate[i] = d[i] * u[i] * sig * (1.f + g[i] * (1.f - sig));
    }
    store_bf16<V>(dgate_up + gate_at, dgate);
    store_bf16<V>(dgate_up + gate_at + ffn, dup);
  }
}

}  // namespace

void embedding_forward(cudaStream_t s, bf16* x, const int32_t* tokens, const bf16* table, int64_t n, int64_t dim) {
  if (n == 0 || dim == 0) return;
  if (packs_of_8(dim, x, table)) {
    embedding_forward_kernel<8><<<grid_for(n * dim / 8, kThreads), kThreads, 0, s>>>(x, tokens, table, n, dim);
  } else {
    embedding_forward_kernel<1><<<grid_for(n * dim, kThreads), kThreads, 0, s>>>(x, tokens, table, n, dim);
  }
  RT_CUDA_CHECK_LAUNCH("embedding_forward_kernel ", "n=", n, " dim=", dim);
}

void embedding_backward(cudaStream_t s, float* dtable, const int32_t* tokens, const bf16* dx, int64_t n, int64_t dim) {
  if (n == 0 || dim == 0) return;
  if (packs_of_8(dim, dx)) {
    embedding_backward_kernel<8><<<grid_for(n * dim / 8, kThreads), kThreads, 0, s>>>(dtable, tokens, dx, n, dim);
  } else {
    embedding_backward_kernel<1><<<grid_for(n * dim, kThreads), kThreads, 0, s>>>(dtable, tokens, dx, n, dim);
  }
  RT_CUDA_CHECK_LAUNCH("embedding_backward_kernel ", "n=", n, " dim=", dim);
}

void swiglu_forward(cudaStream_t s, bf16* h, const bf16* gate_up, int64_t n, int64_t ffn) {
  if (n == 0 || ffn == 0) return;
  if (packs_of_8(ffn, h, gate_up)) {
    swiglu_forward_kernel<8><<<grid_for(n * ffn / 8, kThreads), kThreads, 0, s>>>(h, gate_up, n, ffn);
  } else {
    swiglu_forward_kernel<1><<<grid_for(n * ffn, kThreads), kThreads, 0, s>>>(h, gate_up, n, ffn);
  }
  RT_CUDA_CHECK_LAUNCH("swiglu_forward_kernel ", "n=", n, " ffn=", ffn);
}

void swiglu_backward(cudaStream_t s, bf16* dgate_up, const bf16* dh, const bf16* gate_up, int64_t n, int64_t ffn) {
  if (n == 0 || ffn == 0) return;
  if (packs_of_8(ffn, dgate_up, dh, gate_up)) {
    swiglu_backward_kernel<8><<<grid_for(n * ffn / 8, kThreads), kThreads, 0, s>>>(dgate_up, dh, gate_up, n, ffn);
  } else {
    swiglu_backward_kernel<1><<<grid_for(n * ffn, kThreads), kThreads, 0, s>>>(dgate_up, dh, gate_up, n, ffn);
  }
  RT_CUDA_CHECK_LAUNCH("swiglu_backward_kernel ", "n=", n, " ffn=", ffn);
}

}  // namespace ringtrain::model::cuda
