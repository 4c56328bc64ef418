// Flash-decoding over a padded KV cache: one block per (key split, kv head, sequence) serves every query row of the
// kv head's group (Hq / Hkv heads x Sq rows, at most kDecodeMaxRows), so each key and value is read once per group
// (GQA), not once per query head. Each block takes kSplitKeys keys: long caches spread over many blocks
// (flash-decoding) even when the batch is small. Per tile of kTile keys the block copies K (rows padded by 16 bytes:
// conflict-free row reads) and V into shared memory, one thread per key computes that key's scores for all rows, one
// warp per row does the online softmax (exp2 on scores pre-scaled by log2 e), and one thread per pair of output
// dimensions accumulates P V for its rows in fp32. With one split the block writes O and LSE; with several, each
// writes its normalised partial O and LSE (fp32) to scratch and decode_merge_kernel combines them (the LSE merge of
// ring attention). Masked keys never enter: a sequence reads only its first kv_used[b] keys, and under a sliding
// window a block skips the key tiles wholly before its first row's window start (row 0 starts first): such a tile
// would leave every row's state as it starts (m = -inf, l = 0, acc = 0), so skipping it changes no bit. A split
// wholly before that start reads no key and writes LSE -inf, like a split past the used length.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "ringtrain/attention/cuda/cuda_util.h"
#include "ringtrain/attention/cuda/decode_kernels.h"
#include "ringtrain/core/cuda/check.h"
#include "ringtrain/core/error.h"

namespace ringtrain::attention::cuda {
namespace {

constexpr int kThreads = 128, kTile = 64;
constexpr int kSplitKeys = 512;  // keys per block (8 tiles)
constexpr float kLog2e = 1.4426950408889634f;

template <typename T>
__device__ inline float2 unpack2(uint32_t raw) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&raw));
  else return __half22float2(*reinterpret_cast<__half2*>(&raw));
}

template <typename T>
__device__ inline void unpack8(const uint4& raw, float (&f)[8]) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 x = unpack2<T>(w[i]);
    f[2 * i] = x.x, f[2 * i + 1] = x.y;
  }
}

template <typename T>
__device__ inline float to_float(T x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(x);
  else return __half2float(x);
}

// Two adjacent outputs in o's element type (the inputs' 16-bit type or fp32).
template <typename T>
__device__ inline void store2(const FlashRows& o, int64_t offset, float x, float y) {
  if (o.elem == FlashElem::F32) {
    *reinterpret_cast<float2*>(static_cast<float*>(o.ptr) + offset) = make_float2(x, y);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    *reinterpret_cast<__nv_bfloat162*>(static_cast<T*>(o.ptr) + offset) = __floats2bfloat162_rn(x, y);
  } else {
    *reinterpret_cast<__half2*>(static_cast<T*>(o.ptr) + offset) = __floats2half2_rn(x, y);
  }
}

__device__ inline float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}
__device__ inline float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    decode_kernel(DecodeCall c, int chunk, int splits, float* part_o, float* part_lse) {
  static_assert(kTile == 64 && kThreads == 128, "two row groups of one key per thread; two keys per lane");
  constexpr int kChunks = D / 8;               // 16-byte pieces of a row
  constexpr int kPairs = D / 2;                // threads per row in P V
  constexpr int kRowStep = kThreads / kPairs;  // rows served at once in P V
  constexpr int kOwned = kDecodeMaxRows / kRowStep;
  __shared__ float qs[kDecodeMaxRows][D];
  __shared__ __align__(16) T ks[kTile][D + 8];
  __shared__ __align__(16) T vs[kTile][D];
  __shared__ float ps[kDecodeMaxRows][kTile];
  __shared__ float m_s[kDecodeMaxRows], l_s[kDecodeMaxRows], alpha_s[kDecodeMaxRows];

  const int split = blockIdx.x, hk = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  const int G = c.heads_q / c.heads_kv, Sq = c.seqlen_q, R = G * Sq;
  const int used = min(max(c.kv_used[b], 0), c.capacity);
  const int k_begin = split * chunk, k_end = min(k_begin + chunk, used);
  // Row i sees [limit - window, limit) with limit = used - Sq + i + 1 (key_start and key_limit in params.h).
  const int first_start = c.window > 0 ? max(used - Sq + 1 - c.window, 0) : 0;
  const int k_first = k_begin + max(first_start - k_begin, 0) / kTile * kTile;  // on the split's tile grid

  const T* Q = static_cast<const T*>(c.q.ptr);
  const float qscale = c.scale * kLog2e;
  for (int idx = tid; idx < R * D; idx += kThreads) {
    const int r = idx / D, d = idx % D, g = r / Sq, i = r % Sq;
    qs[r][d] = to_float(Q[b * c.q.batch_stride + i * c.q.row_stride + (hk * G + g) * c.q.head_stride + d]) * qscale;
  }
  if (tid < kDecodeMaxRows) m_s[tid] = -INFINITY, l_s[tid] = 0.f;
  const int dp = tid % kPairs, rg = tid / kPairs;
  float2 acc[kOwned];
#pragma unroll
  for (int j = 0; j < kOwned; ++j) acc[j] = make_float2(0.f, 0.f);
  const T* K = static_cast<const T*>(c.k.ptr) + b * c.k.batch_stride + hk * c.k.head_stride;
  const T* V = static_cast<const T*>(c.v.ptr) + b * c.v.batch_stride + hk * c.v.head_stride;
  __syncthreads();

  for (int k0 = k_first; k0 < k_end; k0 += kTile) {
    const int n = min(kTile, k_end - k0);
    for (int idx = tid; idx < kTile * kChunks; idx += kThreads) {
      const int key = idx / kChunks, ch = idx % kChunks;
      uint4 kr = make_uint4(0, 0, 0, 0), vr = kr;
      if (key < n) {
        kr = *reinterpret_cast<const uint4*>(K + static_cast<int64_t>(k0 + key) * c.k.row_stride + ch * 8);
        vr = *reinterpret_cast<const uint4*>(V + static_cast<int64_t>(k0 + key) * c.v.row_stride + ch * 8);
      }
      *reinterpret_cast<uint4*>(&ks[key][ch * 8]) = kr;
      *reinterpret_cast<uint4*>(&vs[key][ch * 8]) = vr;
    }
    __syncthreads();
    {  // scores: thread = (key, rows of one parity)
      const int key = tid % kTile, r0 = tid / kTile;
      float s[kDecodeMaxRows / 2];
#pragma unroll
      for (int j = 0; j < kDecodeMaxRows / 2; ++j) s[j] = 0.f;
#pragma unroll 4
      for (int ch = 0; ch < kChunks; ++ch) {
        float kf[8];
        unpack8<T>(*reinterpret_cast<const uint4*>(&ks[key][ch * 8]), kf);
#pragma unroll
        for (int j = 0; j < kDecodeMaxRows / 2; ++j) {
          const int r = r0 + 2 * j;
          if (r < R) {
#pragma unroll
            for (int e = 0; e < 8; ++e) s[j] = fmaf(qs[r][ch * 8 + e], kf[e], s[j]);
          }
        }
      }
#pragma unroll
      for (int j = 0; j < kDecodeMaxRows / 2; ++j) {
        const int r = r0 + 2 * j;
        if (r >= R) continue;
        const int i = r % Sq;
        const int limit = c.mask == kMaskNone ? used : used - Sq + i + 1, start = limit - c.window;
        ps[r][key] = key < n && k0 + key < limit && (c.window == 0 || k0 + key >= start) ? s[j] : -INFINITY;
      }
    }
    __syncthreads();
    {  // online softmax: one warp per row
      const int warp = tid / 32, lane = tid % 32;
      for (int r = warp; r < R; r += kThreads / 32) {
        const float a = ps[r][lane], bb = ps[r][lane + 32];
        const float m_old = m_s[r], m_new = fmaxf(m_old, warp_max(fmaxf(a, bb)));
        float pa = 0.f, pb = 0.f, alpha = 1.f;
        if (m_new != -INFINITY) pa = exp2f(a - m_new), pb = exp2f(bb - m_new), alpha = exp2f(m_old - m_new);
        const float sum = warp_sum(pa + pb);
        ps[r][lane] = pa, ps[r][lane + 32] = pb;
        if (lane == 0) l_s[r] = l_s[r] * alpha + sum, m_s[r] = m_new, alpha_s[r] = alpha;
      }
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kOwned; ++j) {
      const int r = rg + kRowStep * j;
      if (r < R) acc[j].x *= alpha_s[r], acc[j].y *= alpha_s[r];
    }
    for (int key = 0; key < n; ++key) {
      const float2 vv = unpack2<T>(*reinterpret_cast<const uint32_t*>(&vs[key][2 * dp]));
#pragma unroll
      for (int j = 0; j < kOwned; ++j) {
        const int r = rg + kRowStep * j;
        if (r < R) {
          const float p = ps[r][key];
          acc[j].x = fmaf(p, vv.x, acc[j].x), acc[j].y = fmaf(p, vv.y, acc[j].y);
        }
      }
    }
    __syncthreads();
  }

  const int64_t rows = static_cast<int64_t>(c.batch) * Sq * c.heads_q;
#pragma unroll
  for (int j = 0; j < kOwned; ++j) {
    const int r = rg + kRowStep * j;
    if (r >= R) continue;
    const int g = r / Sq, i = r % Sq, h = hk * G + g;
    const float l = l_s[r];
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const float lse = l > 0.f ? (m_s[r] + log2f(l)) / kLog2e : -INFINITY;
    if (splits == 1) {
      store2<T>(c.o, b * c.o.batch_stride + i * c.o.row_stride + h * c.o.head_stride + 2 * dp, acc[j].x * inv,
                acc[j].y * inv);
      if (dp == 0) c.lse.ptr[b * c.lse.batch_stride + h * c.lse.head_stride + i * c.lse.row_stride] = lse;
    } else {
      const int64_t row = split * rows + (static_cast<int64_t>(b) * Sq + i) * c.heads_q + h;
      *reinterpret_cast<float2*>(part_o + row * D + 2 * dp) = make_float2(acc[j].x * inv, acc[j].y * inv);
      if (dp == 0) part_lse[row] = lse;
    }
  }
}

// One block per query row (b, i, h), one thread per pair of dimensions. A split in which the row sees no key (past
// the used length, or before the row's window) has LSE -inf and O = 0: weight exactly 0, so the row's result is
// that of its other splits alone, bit for bit.
template <typename T, int D>
__global__ void decode_merge_kernel(DecodeCall c, int splits, const float* part_o, const float* part_lse) {
  const int64_t rows = static_cast<int64_t>(c.batch) * c.seqlen_q * c.heads_q, row = blockIdx.x;
  const int h = static_cast<int>(row % c.heads_q), i = static_cast<int>(row / c.heads_q % c.seqlen_q);
  const int64_t b = row / c.heads_q / c.seqlen_q;
  const int dp = threadIdx.x;
  float m = -INFINITY;
  for (int s = 0; s < splits; ++s) m = fmaxf(m, part_lse[s * rows + row]);
  float x = 0.f, y = 0.f, total = 0.f;
  if (m != -INFINITY) {
    for (int s = 0; s < splits; ++s) {
      const float w = __expf(part_lse[s * rows + row] - m);
      const float2 po = *reinterpret_cast<const float2*>(part_o + (s * rows + row) * D + 2 * dp);
      x = fmaf(w, po.x, x), y = fmaf(w, po.y, y), total += w;
    }
    x /= total, y /= total;
  }
  store2<T>(c.o, b * c.o.batch_stride + i * c.o.row_stride + h * c.o.head_stride + 2 * dp, x, y);
  if (dp == 0)
    c.lse.ptr[b * c.lse.batch_stride + h * c.lse.head_stride + i * c.lse.row_stride] =
        m == -INFINITY ? -INFINITY : m + logf(total);
}

template <typename T, int D>
void launch(const DecodeCall& c, cudaStream_t stream) {
  // A fixed split of the keys (not one derived from the batch or the capacity): a row's result then depends on its
  // own keys only, bit for bit, whatever the batch it is decoded in. A split past a sequence's used length adds
  // nothing (LSE -inf: weight exactly 0 in the merge).
  const int chunk = kSplitKeys, splits = std::max(1, (c.capacity + chunk - 1) / chunk);
  const int64_t rows = static_cast<int64_t>(c.batch) * c.seqlen_q * c.heads_q;
  StreamScratch scratch(splits > 1 ? static_cast<size_t>(splits * rows * (D + 1)) * sizeof(float) : 0, stream,
                        "decode attention partial results");
  float* part_o = reinterpret_cast<float*>(scratch.bytes());
  float* part_lse = part_o ? part_o + splits * rows * D : nullptr;
  decode_kernel<T, D><<<dim3(splits, c.heads_kv, c.batch), kThreads, 0, stream>>>(c, chunk, splits, part_o, part_lse);
  RT_CUDA_CHECK_LAUNCH("decode_kernel B=", c.batch, " Hq=", c.heads_q, " Hkv=", c.heads_kv, " D=", D, " Sq=",
                       c.seqlen_q, " capacity=", c.capacity, " splits=", splits);
  if (splits > 1) {
    decode_merge_kernel<T, D><<<static_cast<unsigned>(rows), D / 2, 0, stream>>>(c, splits, part_o, part_lse);
    RT_CUDA_CHECK_LAUNCH("decode_merge_kernel rows=", rows, " splits=", splits);
  }
}

}  // namespace

bool decode_head_dim_supported(int64_t d) { return d == 16 || d == 32 || d == 64 || d == 128; }

void decode_forward(const DecodeCall& c, cudaStream_t stream) {
  RT_CHECK(decode_head_dim_supported(c.head_dim), "decode (cuda): head dim ", c.head_dim, " (needs 16, 32, 64 or 128)");
  RT_CHECK(c.heads_q % c.heads_kv == 0 && c.heads_q / c.heads_kv * c.seqlen_q <= kDecodeMaxRows,
           "decode (cuda): ", c.heads_q / c.heads_kv, " heads per kv head x ", c.seqlen_q, " rows exceeds ",
           kDecodeMaxRows);
  if (c.batch == 0 || c.seqlen_q == 0) return;
  const auto run = [&]<typename T>() {
    switch (c.head_dim) {
      case 16: launch<T, 16>(c, stream); break;
      case 32: launch<T, 32>(c, stream); break;
      case 64: launch<T, 64>(c, stream); break;
      default: launch<T, 128>(c, stream); break;
    }
  };
  if (c.bf16) run.template operator()<__nv_bfloat16>();
  else run.template operator()<__half>();
}

}  // namespace ringtrain::attention::cuda
