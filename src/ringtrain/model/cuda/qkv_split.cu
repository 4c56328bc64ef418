// From the fused q/k/v projection to the attention inputs: per-head RMSNorm (Qwen3) and rotate-half RoPE on q and
// k, a plain copy for v; and the transpose for the backward. One block per token (blocks walk tokens with a grid
// stride); with per-head norms one warp per head (the norm is a per-head reduction), without them the block's
// threads sweep the token's values as one flat list. The token's cos/sin table is computed once per block in shared
// memory: the angle is the fp32 product position * inv_freq[i] (as transformers and model/rope.cpp form it), cos/sin
// in fp32.
// Lanes move packs of 2 bf16 when head_dim % 4 == 0 (both halves then stay 4-byte aligned), else single values; the
// norm-free path moves packs of 8 (16 bytes) when head_dim % 16 == 0.
#include <algorithm>

#include "ringtrain/model/cuda/kernel_util.cuh"
#include "ringtrain/model/cuda/layer_kernels.h"

namespace ringtrain::model::cuda {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;

__device__ inline void fill_rope_table(float* cos_t, float* sin_t, int32_t position, const float* inv_freq,
                                       int64_t half) {
  for (int64_t i = threadIdx.x; i < half; i += kThreads) {
    const float angle = static_cast<float>(position) * inv_freq[i];
    sincosf(angle, &sin_t[i], &cos_t[i]);
  }
}

template <int V>
__device__ inline void copy_head(bf16* dst, const bf16* src, int64_t d, int lane) {
  for (int64_t c = lane * V; c < d; c += 32 * V) {
    float v[V];
    load_bf16<V>(src + c, v);
    store_bf16<V>(dst + c, v);
  }
}

// 1 / sqrt(mean(x^2) + eps) over one head of d values; every lane gets it.
template <int V>
__device__ inline float head_rstd(const bf16* x, int64_t d, float eps, int lane) {
  float sum_sq = 0.f;
  for (int64_t c = lane * V; c < d; c += 32 * V) {
    float v[V];
    load_bf16<V>(x + c, v);
#pragma unroll
    for (int j = 0; j < V; ++j) sum_sq += v[j] * v[j];
  }
  return 1.f / sqrtf(warp_sum(sum_sq) / static_cast<float>(d) + eps);
}

// The pair (a, b) = values (i, i + half) of a head, rotated by the angle theta, stored at dst + i and dst + half + i.
template <int V>
__device__ inline void rotate_store(bf16* dst, int64_t i, int64_t half, const float* cos_t, const float* sin_t,
                                    const float (&a)[V], const float (&b)[V]) {
  float out_a[V], out_b[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const float c = cos_t[i + j], s = sin_t[i + j];
    out_a[j] = a[j] * c - b[j] * s;
    out_b[j] = b[j] * c + a[j] * s;
  }
  store_bf16<V>(dst + i, out_a);
  store_bf16<V>(dst + half + i, out_b);
}

// The gradient of the rotated pair (i, i + half) taken back through the rotation (the transpose: angle -theta).
template <int V>
__device__ inline void unrotate(const bf16* g, int64_t i, int64_t half, const float* cos_t, const float* sin_t,
                                float (&ga)[V], float (&gb)[V]) {
  float a[V], b[V];
  load_bf16<V>(g + i, a);
  load_bf16<V>(g + half + i, b);
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const float c = cos_t[i + j], s = sin_t[i + j];
    ga[j] = a[j] * c + b[j] * s;
    gb[j] = b[j] * c - a[j] * s;
  }
}

// What the per-head RMSNorm backward reads at the pair (i, i + half) of one head: the gradient taken back through the
// rotation (g), the norm's input (x) and its weight (w). Both of its passes read the same.
template <int V>
struct NormPair {
  float ga[V], gb[V], xa[V], xb[V], wa[V], wb[V];
  __device__ NormPair(const bf16* g, const bf16* x, const bf16* w, int64_t i, int64_t half, const float* cos_t,
                      const float* sin_t) {
    unrotate<V>(g, i, half, cos_t, sin_t, ga, gb);
    load_bf16<V>(x + i, xa);
    load_bf16<V>(x + half + i, xb);
    load_bf16<V>(w + i, wa);
    load_bf16<V>(w + half + i, wb);
  }
};

template <int V>
__global__ void qkv_split_forward_kernel(QkvShape sh, bf16* q, bf16* k, bf16* v, float* rstd_q, float* rstd_k,
                                         const bf16* qkv, const bf16* q_norm, const bf16* k_norm,
                                         const int32_t* positions, const float* inv_freq) {
  extern __shared__ float rope_table[];  // cos [half], then sin [half]
  const int64_t d = sh.head_dim, half = d / 2, heads = sh.heads_q + 2 * sh.heads_kv;
  float *cos_t = rope_table, *sin_t = rope_table + half;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int64_t t = blockIdx.x; t < sh.n; t += gridDim.x) {
    __syncthreads();  // every warp is done with the previous token's table
    fill_rope_table(cos_t, sin_t, positions[t], inv_freq, half);
    __syncthreads();
    for (int64_t h = warp; h < heads; h += kWarps) {
      const bf16* src = qkv + (t * heads + h) * d;
      if (h >= sh.heads_q + sh.heads_kv) {
        copy_head<V>(v + (t * sh.heads_kv + h - sh.heads_q - sh.heads_kv) * d, src, d, lane);
        continue;
      }
      const bool is_q = h < sh.heads_q;
      const int64_t head_count = is_q ? sh.heads_q : sh.heads_kv;
      const int64_t head_at = t * head_count + (is_q ? h : h - sh.heads_q);  // [token, head] index in q or k
      bf16* dst = (is_q ? q : k) + head_at * d;
      const bf16* norm_w = is_q ? q_norm : k_norm;
      float r = 1.f;
      if (norm_w) {
        r = head_rstd<V>(src, d, sh.norm_eps, lane);
        if (lane == 0) (is_q ? rstd_q : rstd_k)[head_at] = r;
      }
      for (int64_t i = lane * V; i < half; i += 32 * V) {
        float a[V], b[V];
        load_bf16<V>(src + i, a);
        load_bf16<V>(src + half + i, b);
        if (norm_w) {
          float wa[V], wb[V];
          load_bf16<V>(norm_w + i, wa);
          load_bf16<V>(norm_w + half + i, wb);
#pragma unroll
          for (int j = 0; j < V; ++j) a[j] = wa[j] * (a[j] * r), b[j] = wb[j] * (b[j] * r);
        }
        rotate_store<V>(dst, i, half, cos_t, sin_t, a, b);
      }
    }
  }
}

// With the norm: u = the un-rotated gradient, x the raw head, w the norm weight, r its rstd:
// dx = r * w * u - x * r^3 * mean(w * u * x), dw += u * x * r (per block in shared memory, flushed at the end).
template <int V>
__global__ void qkv_split_backward_kernel(QkvShape sh, bf16* dqkv, float* dq_norm, float* dk_norm, const bf16* dq,
                                          const bf16* dk, const bf16* dv, const bf16* qkv, const bf16* q_norm,
                                          const bf16* k_norm, const float* rstd_q, const float* rstd_k,
                                          const int32_t* positions, const float* inv_freq) {
  extern __shared__ float shared[];  // cos [half], sin [half], dq_norm partial [d], dk_norm partial [d]
  const int64_t d = sh.head_dim, half = d / 2, heads = sh.heads_q + 2 * sh.heads_kv;
  float *cos_t = shared, *sin_t = shared + half, *dwq_block = shared + d, *dwk_block = shared + 2 * d;
  for (int64_t j = threadIdx.x; j < 2 * d; j += kThreads) dwq_block[j] = 0.f;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int64_t t = blockIdx.x; t < sh.n; t += gridDim.x) {
    __syncthreads();  // the partials are zeroed / every warp is done with the previous token's table
    fill_rope_table(cos_t, sin_t, positions[t], inv_freq, half);
    __syncthreads();
    for (int64_t h = warp; h < heads; h += kWarps) {
      bf16* dst = dqkv + (t * heads + h) * d;
      if (h >= sh.heads_q + sh.heads_kv) {
        copy_head<V>(dst, dv + (t * sh.heads_kv + h - sh.heads_q - sh.heads_kv) * d, d, lane);
        continue;
      }
      const bool is_q = h < sh.heads_q;
      const int64_t head_count = is_q ? sh.heads_q : sh.heads_kv;
      const int64_t head_at = t * head_count + (is_q ? h : h - sh.heads_q);
      const bf16* g = (is_q ? dq : dk) + head_at * d;
      const bf16* norm_w = is_q ? q_norm : k_norm;
      if (!norm_w) {
        for (int64_t i = lane * V; i < half; i += 32 * V) {
          float ga[V], gb[V];
          unrotate<V>(g, i, half, cos_t, sin_t, ga, gb);
          store_bf16<V>(dst + i, ga);
          store_bf16<V>(dst + half + i, gb);
        }
        continue;
      }
      const bf16* x = qkv + (t * heads + h) * d;
      const float r = (is_q ? rstd_q : rstd_k)[head_at];
      float* dw_block = is_q ? dwq_block : dwk_block;
      float dot = 0.f;
      for (int64_t i = lane * V; i < half; i += 32 * V) {
        const NormPair<V> p(g, x, norm_w, i, half, cos_t, sin_t);
#pragma unroll
        for (int j = 0; j < V; ++j) dot += p.wa[j] * p.ga[j] * p.xa[j] + p.wb[j] * p.gb[j] * p.xb[j];
      }
      const float coef = r * r * r * warp_sum(dot) / static_cast<float>(d);
      for (int64_t i = lane * V; i < half; i += 32 * V) {
        const NormPair<V> p(g, x, norm_w, i, half, cos_t, sin_t);
        float out_a[V], out_b[V];
#pragma unroll
        for (int j = 0; j < V; ++j) {
          out_a[j] = r * p.wa[j] * p.ga[j] - coef * p.xa[j];
          out_b[j] = r * p.wb[j] * p.gb[j] - coef * p.xb[j];
          atomicAdd(&dw_block[i + j], p.ga[j] * p.xa[j] * r);
          atomicAdd(&dw_block[half + i + j], p.gb[j] * p.xb[j] * r);
        }
        store_bf16<V>(dst + i, out_a);
        store_bf16<V>(dst + half + i, out_b);
      }
    }
  }
  __syncthreads();
  for (int64_t j = threadIdx.x; j < d; j += kThreads) {
    if (dq_norm) atomicAdd(&dq_norm[j], dwq_block[j]);
    if (dk_norm) atomicAdd(&dk_norm[j], dwk_block[j]);
  }
}

// Without per-head norms (Llama, Qwen2, Mistral) the block's threads sweep the token's rotation pairs and v values
// as one flat list of V-packs, so every lane has work at any head dim (a warp per head leaves half of its lanes idle
// at d = 64). Forward (kForward): qkv -> rotated q, k and v; backward: dq, dk (un-rotated) and dv -> dqkv.
template <int V, bool kForward>
__global__ void rope_flat_kernel(QkvShape sh, bf16* q, bf16* k, bf16* v, bf16* qkv, const int32_t* positions,
                                 const float* inv_freq) {
  extern __shared__ float rope_table[];  // cos [half], then sin [half]
  const int64_t d = sh.head_dim, half = d / 2, hq = sh.heads_q, hkv = sh.heads_kv, heads = hq + 2 * hkv;
  const int64_t packs = half / V, rot_items = (hq + hkv) * packs, items = rot_items + hkv * d / V;
  float *cos_t = rope_table, *sin_t = rope_table + half;
  for (int64_t t = blockIdx.x; t < sh.n; t += gridDim.x) {
    __syncthreads();  // every thread is done with the previous token's table
    fill_rope_table(cos_t, sin_t, positions[t], inv_freq, half);
    __syncthreads();
    bf16* row = qkv + t * heads * d;
    for (int64_t p = threadIdx.x; p < items; p += kThreads) {
      if (p >= rot_items) {  // v: a copy
        const int64_t e = (p - rot_items) * V;
        float x[V];
        if constexpr (kForward) {
          load_bf16<V>(row + (hq + hkv) * d + e, x);
          store_bf16<V>(v + t * hkv * d + e, x);
        } else {
          load_bf16<V>(v + t * hkv * d + e, x);
          store_bf16<V>(row + (hq + hkv) * d + e, x);
        }
        continue;
      }
      const int64_t h = p / packs, i = (p % packs) * V;
      bf16* head = row + h * d;
      bf16* qk = h < hq ? q + (t * hq + h) * d : k + (t * hkv + h - hq) * d;
      if constexpr (kForward) {
        float a[V], b[V];
        load_bf16<V>(head + i, a);
        load_bf16<V>(head + half + i, b);
        rotate_store<V>(qk, i, half, cos_t, sin_t, a, b);
      } else {
        float ga[V], gb[V];
        unrotate<V>(qk, i, half, cos_t, sin_t, ga, gb);
        store_bf16<V>(head + i, ga);
        store_bf16<V>(head + half + i, gb);
      }
    }
  }
}

void check_shape(const QkvShape& sh, const char* what) {
  RT_CHECK(sh.head_dim > 0 && sh.head_dim % 2 == 0, what, ": RoPE needs an even head_dim, got ", sh.head_dim);
  RT_CHECK(sh.heads_q > 0 && sh.heads_kv > 0, what, ": head counts must be positive, got q ", sh.heads_q, " kv ",
           sh.heads_kv);
}

// Blocks for the token loop: enough for full occupancy (8 blocks of 256 threads per multiprocessor), at most n.
unsigned token_blocks(int64_t n) { return static_cast<unsigned>(std::min<int64_t>(n, int64_t{8} * sm_count())); }

// The norm-free path; q, k and v are written in the forward and read in the backward, qkv the other way round.
template <bool kForward>
void launch_rope_flat(cudaStream_t s, const QkvShape& sh, bf16* q, bf16* k, bf16* v, bf16* qkv,
                      const int32_t* positions, const float* inv_freq) {
  const size_t shared = static_cast<size_t>(sh.head_dim) * sizeof(float);  // the cos and sin tables
  if (sh.head_dim % 16 == 0 && all_aligned(16, q, k, v, qkv))  // both halves of every head in 16-byte packs
    rope_flat_kernel<8, kForward><<<token_blocks(sh.n), kThreads, shared, s>>>(sh, q, k, v, qkv, positions, inv_freq);
  else if (sh.head_dim % 4 == 0 && all_aligned(4, q, k, v, qkv))
    rope_flat_kernel<2, kForward><<<token_blocks(sh.n), kThreads, shared, s>>>(sh, q, k, v, qkv, positions, inv_freq);
  else
    rope_flat_kernel<1, kForward><<<token_blocks(sh.n), kThreads, shared, s>>>(sh, q, k, v, qkv, positions, inv_freq);
}

}  // namespace

void qkv_split_forward(cudaStream_t s, const QkvShape& sh, bf16* q, bf16* k, bf16* v, float* rstd_q, float* rstd_k,
                       const bf16* qkv, const bf16* q_norm, const bf16* k_norm, const int32_t* positions,
                       const float* inv_freq) {
  check_shape(sh, "qkv_split_forward");
  RT_CHECK((!q_norm || rstd_q) && (!k_norm || rstd_k), "qkv_split_forward: a per-head norm needs its rstd buffer");
  if (sh.n == 0) return;
  const size_t shared = static_cast<size_t>(sh.head_dim) * sizeof(float);
  if (!q_norm && !k_norm) {
    launch_rope_flat<true>(s, sh, q, k, v, const_cast<bf16*>(qkv), positions, inv_freq);
  } else if (sh.head_dim % 4 == 0 && all_aligned(4, q, k, v, qkv, q_norm, k_norm)) {
    qkv_split_forward_kernel<2><<<token_blocks(sh.n), kThreads, shared, s>>>(sh, q, k, v, rstd_q, rstd_k, qkv, q_norm,
                                                                             k_norm, positions, inv_freq);
  } else {
    qkv_split_forward_kernel<1><<<token_blocks(sh.n), kThreads, shared, s>>>(sh, q, k, v, rstd_q, rstd_k, qkv, q_norm,
                                                                             k_norm, positions, inv_freq);
  }
  RT_CUDA_CHECK_LAUNCH("qkv_split_forward_kernel ", "n=", sh.n, " heads q/kv ", sh.heads_q, "/", sh.heads_kv,
                  " head_dim=", sh.head_dim);
}

void qkv_split_backward(cudaStream_t s, const QkvShape& sh, bf16* dqkv, float* dq_norm, float* dk_norm, const bf16* dq,
                        const bf16* dk, const bf16* dv, const bf16* qkv, const bf16* q_norm, const bf16* k_norm,
                        const float* rstd_q, const float* rstd_k, const int32_t* positions, const float* inv_freq) {
  check_shape(sh, "qkv_split_backward");
  RT_CHECK((!q_norm || (rstd_q && dq_norm)) && (!k_norm || (rstd_k && dk_norm)),
           "qkv_split_backward: a per-head norm needs its saved rstd and its weight-gradient buffer");
  if (sh.n == 0) return;
  const size_t shared = 3 * static_cast<size_t>(sh.head_dim) * sizeof(float);
  if (!q_norm && !k_norm) {
    launch_rope_flat<false>(s, sh, const_cast<bf16*>(dq), const_cast<bf16*>(dk), const_cast<bf16*>(dv), dqkv,
                            positions, inv_freq);
  } else if (sh.head_dim % 4 == 0 && all_aligned(4, dqkv, dq, dk, dv, qkv, q_norm, k_norm)) {
    qkv_split_backward_kernel<2><<<token_blocks(sh.n), kThreads, shared, s>>>(
        sh, dqkv, q_norm ? dq_norm : nullptr, k_norm ? dk_norm : nullptr, dq, dk, dv, qkv, q_norm, k_norm, rstd_q,
        rstd_k, positions, inv_freq);
  } else {
    qkv_split_backward_kernel<1><<<token_blocks(sh.n), kThreads, shared, s>>>(
        sh, dqkv, q_norm ? dq_norm : nullptr, k_norm ? dk_norm : nullptr, dq, dk, dv, qkv, q_norm, k_norm, rstd_q,
        rstd_k, positions, inv_freq);
  }
  RT_CUDA_CHECK_LAUNCH("qkv_split_backward_kernel ", "n=", sh.n, " heads q/kv ", sh.heads_q, "/", sh.heads_kv,
                  " head_dim=", sh.head_dim);
}

}  // namespace ringtrain::model::cuda
