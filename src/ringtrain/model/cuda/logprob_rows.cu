// Token log-probabilities from fp32 logits, one block per row: a single pass keeps a running (max, sum of
// exp(z - max)) per thread, merged across the block; lse = max + log(sum). For the entropy the pass also keeps
// sum of exp(z - max) (z - max), so that H = lse - sum p z = log(sum) - that / sum. The backward recomputes softmax from the
// saved lse and writes the bf16 gradient in place of the logits. Rows are read as float4 when vocab % 4 == 0 and the
// base is 16-byte aligned.
#include <algorithm>
#include <cmath>

#include "ringtrain/model/cuda/kernel_util.cuh"
#include "ringtrain/model/cuda/layer_kernels.h"

namespace ringtrain::model::cuda {
namespace {

constexpr int kRowThreads = 512, kRowWarps = kRowThreads / 32;

template <int V>
__device__ inline void load_f32(const float* p, float (&out)[V]) {
  if constexpr (V == 4) {
    const float4 f = *reinterpret_cast<const float4*>(p);
    out[0] = f.x, out[1] = f.y, out[2] = f.z, out[3] = f.w;
  } else {
    static_assert(V == 1, "packs of 1 or 4 floats");
    out[0] = *p;
  }
}

// The running statistics of a set of logits z: max, sum of exp(z - max) and, for the entropy, sum of
// exp(z - max) (z - max). A set of -inf logits only is (-inf, anything) and adds nothing. A NaN max is taken over
// (fmaxf would drop it) so that NaN logits give a NaN lse.
template <bool Entropy>
struct ExpSums {
  float max = -INFINITY, sum = 0.f, sum_ez = 0.f;

  __device__ void merge(float other_max, float other_sum, float other_sum_ez) {
    if (other_max == -INFINITY) return;
    if (max == -INFINITY || isnan(other_max)) {
      max = other_max, sum = other_sum, sum_ez = other_sum_ez;
      return;
    }
    const float m = fmaxf(max, other_max);
    const float shift = max - m, other_shift = other_max - m;
    const float scale = expf(shift), other_scale = expf(other_shift);
    // exp(z - m) (z - m) = exp(z - max) exp(shift) ((z - max) + shift)
    if constexpr (Entropy)
      sum_ez = scale * (sum_ez + shift * sum) + other_scale * (other_sum_ez + other_shift * other_sum);
    sum = sum * scale + other_sum * other_scale;
    max = m;
  }
  __device__ void shuffle_merge(int offset) {
    const float other_max = __shfl_xor_sync(0xffffffffu, max, offset);
    const float other_sum = __shfl_xor_sync(0xffffffffu, sum, offset);
    const float other_sum_ez = Entropy ? __shfl_xor_sync(0xffffffffu, sum_ez, offset) : 0.f;
    merge(other_max, other_sum, other_sum_ez);
  }
};

template <int V, bool Entropy>
__global__ void logprob_rows_kernel(float* logprob, float* lse, const float* logits, const int32_t* targets,
                                    int64_t vocab, float* entropy) {
  __shared__ float warp_max_s[kRowWarps], warp_sum_s[kRowWarps], warp_sum_ez_s[kRowWarps];
  const int64_t row = blockIdx.x;
  const float* z = logits + row * vocab;
  ExpSums<Entropy> acc;
  // Unrolled so that several loads are in flight before the (max, sum) chain needs them.
#pragma unroll 4
  for (int64_t c = threadIdx.x * V; c < vocab; c += kRowThreads * V) {
    float v[V];
    load_f32<V>(z + c, v);
    float pack_max = v[0];
#pragma unroll
    for (int i = 1; i < V; ++i) pack_max = fmaxf(pack_max, v[i]);
    float pack_sum = 0.f, pack_sum_ez = 0.f;
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const float shifted = v[i] - pack_max, e = expf(shifted);
      pack_sum += e;
      if constexpr (Entropy) pack_sum_ez += e > 0.f ? e * shifted : 0.f;  // a -inf logit adds 0, not NaN
    }
    acc.merge(pack_max, pack_sum, pack_sum_ez);
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) acc.shuffle_merge(offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_max_s[warp] = acc.max, warp_sum_s[warp] = acc.sum, warp_sum_ez_s[warp] = acc.sum_ez;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kRowWarps; ++w) acc.merge(warp_max_s[w], warp_sum_s[w], warp_sum_ez_s[w]);
    const float row_lse = acc.max + logf(acc.sum);
    const int32_t t = targets[row];
    lse[row] = row_lse;
    logprob[row] = t >= 0 ? z[t] - row_lse : 0.f;
    if constexpr (Entropy) entropy[row] = logf(acc.sum) - acc.sum_ez / acc.sum;
  }
}

// One block per row (striding over rows). The row's bf16 gradient is written over the first half of the row's own
// fp32 logits: column j's two bytes land on the bytes of column j / 2. A tile's loads all finish (the barrier) before
// its stores, which cover only columns of this tile and earlier ones, so no logit is overwritten before it is read.
template <int V>
__global__ void logprob_rows_backward_kernel(float* logits, const float* lse, const int32_t* targets,
                                             const float* d_logprob, int64_t rows, int64_t vocab) {
  constexpr int kPacks = 4;  // packs per thread and tile: loads in flight before the barrier
  const int64_t tile = int64_t{kRowThreads} * V * kPacks;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    float* z = logits + row * vocab;
    bf16* dz = reinterpret_cast<bf16*>(z);
    const int32_t t = targets[row];
    const float g = t < 0 ? 0.f : d_logprob[row], row_lse = lse[row];
    for (int64_t c0 = 0; c0 < vocab; c0 += tile) {
      float v[kPacks][V];
#pragma unroll
      for (int u = 0; u < kPacks; ++u) {
        const int64_t col = c0 + (int64_t{u} * kRowThreads + threadIdx.x) * V;
        if (t >= 0 && col < vocab) load_f32<V>(z + col, v[u]);
      }
      __syncthreads();
#pragma unroll
      for (int u = 0; u < kPacks; ++u) {
        const int64_t col = c0 + (int64_t{u} * kRowThreads + threadIdx.x) * V;
        if (col >= vocab) continue;
        float out[V];
#pragma unroll
        for (int i = 0; i < V; ++i) out[i] = t < 0 ? 0.f : g * ((col + i == t ? 1.f : 0.f) - expf(v[u][i] - row_lse));
        store_bf16<V>(dz + col, out);
      }
    }
  }
}

}  // namespace

void logprob_rows(cudaStream_t s, float* logprob, float* lse, const float* logits, const int32_t* targets, int64_t rows,
                  int64_t vocab, float* entropy) {
  if (rows == 0) return;
  RT_CHECK(vocab > 0, "logprob_rows: vocab must be positive, got ", vocab);
  RT_CHECK(rows < (int64_t{1} << 31), "logprob_rows: ", rows, " rows exceed one grid");
  const auto launch = [&](auto kernel) {
    kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, s>>>(logprob, lse, logits, targets, vocab, entropy);
  };
  const bool packs = vocab % 4 == 0 && all_aligned(16, logits);
  if (entropy) launch(packs ? logprob_rows_kernel<4, true> : logprob_rows_kernel<1, true>);
  else launch(packs ? logprob_rows_kernel<4, false> : logprob_rows_kernel<1, false>);
  RT_CUDA_CHECK_LAUNCH("logprob_rows_kernel ", "rows=", rows, " vocab=", vocab);
}

bf16* logprob_rows_backward_in_place(cudaStream_t s, float* logits, const float* lse, const int32_t* targets,
                                    const float* d_logprob, int64_t rows, int64_t vocab) {
  if (rows == 0) return reinterpret_cast<bf16*>(logits);
  RT_CHECK(vocab > 0, "logprob_rows_backward_in_place: vocab must be positive, got ", vocab);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(rows, int64_t{1} << 30));
  if (vocab % 4 == 0 && all_aligned(16, logits)) {
    logprob_rows_backward_kernel<4><<<grid, kRowThreads, 0, s>>>(logits, lse, targets, d_logprob, rows, vocab);
  } else {
    logprob_rows_backward_kernel<1><<<grid, kRowThreads, 0, s>>>(logits, lse, targets, d_logprob, rows, vocab);
  }
  RT_CUDA_CHECK_LAUNCH("logprob_rows_backward_kernel ", "rows=", rows, " vocab=", vocab);
  return reinterpret_cast<bf16*>(logits);
}

}  // namespace ringtrain::model::cuda
