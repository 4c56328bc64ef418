// `efficient` on CUDA cores: any supported dtype (fp32 computed with exact fp32 FMAs), head dim a multiple of 8 up to
// 256, any row strides. Tiles of 32 query rows x 32 keys; Q/K/V/dO tiles are converted to fp32 in shared memory with
// a row pitch of D + 1 floats (the column reads of 8 different rows then fall into 8 different banks).
// 256 threads: thread (r = tid / 8, c = tid % 8) owns score row r and the columns c, c + 8, c + 16, c + 24 of a
// 32 x 32 score tile, and the output columns c, c + 8, ... (up to 32 of them) of its row. The 8 threads of a row are
// 8 consecutive lanes of one warp, so row reductions are 3 shuffles and the row's P/dS exchange needs only __syncwarp.
// Forward: online softmax in natural-log units (expf, not the exp2 approximation), O rescaled once at the end.
// Backward: delta = rowsum(dO * O) (shared with the tensor-core path), then dK/dV per key tile over the query tiles
// of every head of the kv group, and dQ per query tile over the key tiles; no atomics, so always deterministic.
// Tiles past the causal limits or wholly outside a sliding window are skipped.
#include "ringtrain/attention/cuda/cuda_util.h"
#include "ringtrain/attention/cuda/efficient_device.cuh"

namespace ringtrain::attention::cuda {
namespace {

using eff::load_elem;
using eff::store_elem;
using tile::bias_row_off;
using tile::key_limit;
using tile::key_start;
using tile::load_bias;
using tile::row_off;
using tile::Seq;
using tile::seq_of;
using tile::stat_off;

constexpr int kTile = 32;           // query rows and keys per tile
constexpr int kThreads = 256;       // 32 rows x 8 threads
constexpr int kMaxCols = 256 / 8;   // output columns per thread at the largest head dim

template <typename T>
__device__ __forceinline__ float to_f32(T x) {
  return static_cast<float>(x);
}

// Rows [row0, row0 + 32) of head `head` of a [.., rows, heads, D] tensor into a [32][pitch] fp32 tile; rows at or past
// row_end become zeros.
template <typename T>
__device__ __forceinline__ void load_rows(float* dst, int pitch, const FlashRows& t, int b, int64_t base_row,
                                          int row0, int row_end, int head, int d) {
  const T* src = static_cast<const T*>(t.ptr);
  for (int idx = threadIdx.x; idx < kTile * d; idx += kThreads) {
    const int r = idx / d, c = idx % d;
    const int row = row0 + r;
    dst[r * pitch + c] = row < row_end ? to_f32(src[row_off(t, b, base_row + row, head) + c]) : 0.f;
  }
}

__device__ __forceinline__ float dot_rows(const float* a, const float* b, int d) {
  float acc = 0.f;
  for (int c = 0; c < d; ++c) acc = fmaf(a[c], b[c], acc);
  return acc;
}

__device__ __forceinline__ float row8_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 4));
}
__device__ __forceinline__ float row8_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  x += __shfl_xor_sync(0xffffffffu, x, 2);
  return x + __shfl_xor_sync(0xffffffffu, x, 4);
}

// The scaled, biased score of (row, key) from its raw dot product; -inf where the key is not visible.
__device__ __forceinline__ float score(const FlashShape& s, const Seq& seq, const EffBias& bias, int b, int h, int row,
                                       int key, float dot) {
  if (row >= seq.sq || key >= seq.skv || key >= key_limit(s, seq, row) || key < key_start(s, seq, row))
    return -INFINITY;
  float x = dot * s.scale;
  if (bias.ptr) x += load_bias(bias, bias_row_off(bias, b, h, row) + key * bias.col_stride);
  return x;
}

// ---------------------------------------------------------------------------------------------------------------
// Forward: one CTA per (query tile, query head, sequence).
template <typename T>
__global__ void __launch_bounds__(kThreads) eff_simt_fwd_kernel(EffFwdCall c) {
  extern __shared__ float smem_f[];
  const FlashShape& s = c.s;
  const int d = s.head_dim, pitch = d + 1;
  float* sQ = smem_f;
  float* sK = sQ + kTile * pitch;
  float* sV = sK + kTile * pitch;
  float* sP = sV + kTile * pitch;  // [32][33]

  const int b = blockIdx.z, h = blockIdx.y, hk = h / (s.heads_q / s.heads_kv);
  const int m0 = (gridDim.x - 1 - blockIdx.x) * kTile;
  const Seq seq = seq_of(s, b);
  if (m0 >= seq.sq) return;
  const int r = threadIdx.x / 8, c8 = threadIdx.x % 8, row = m0 + r;
  const int n_end = key_limit(s, seq, min(m0 + kTile, seq.sq) - 1);

  load_rows<T>(sQ, pitch, c.q, b, seq.q_row0, m0, seq.sq, h, d);
  float o[kMaxCols] = {};
  float row_max = -INFINITY, row_sum = 0.f;
  // Window starts grow with the row: key tiles before the first row's start hold no visible key.
  for (int n0 = key_start(s, seq, m0) / kTile * kTile; n0 < n_end; n0 += kTile) {
    __syncthreads();  // every thread is done with the previous K/V tile (and sQ is written, first time)
    load_rows<T>(sK, pitch, c.k, b, seq.kv_row0, n0, seq.skv, hk, d);
    load_rows<T>(sV, pitch, c.v, b, seq.kv_row0, n0, seq.skv, hk, d);
    __syncthreads();
    float x[4];
    float mx = row_max;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const int j = c8 + 8 * kk;
      x[kk] = score(s, seq, c.bias, b, h, row, n0 + j, dot_rows(sQ + r * pitch, sK + j * pitch, d));
      mx = fmaxf(mx, x[kk]);
    }
    mx = row8_max(mx);
    const float m_use = mx == -INFINITY ? 0.f : mx;  // no finite score yet: exp gives 0, not NaN
    const float alpha = expf(row_max - m_use);
    row_max = mx;
    float sum = 0.f;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const float p = expf(x[kk] - m_use);
      sP[r * (kTile + 1) + c8 + 8 * kk] = p;
      sum += p;
    }
    row_sum = row_sum * alpha + row8_sum(sum);
    __syncwarp();  // the row's P values come from the 8 lanes of this row
#pragma unroll
    for (int k = 0; k < kMaxCols; ++k) o[k] *= alpha;
    for (int j = 0; j < kTile; ++j) {
      const float p = sP[r * (kTile + 1) + j];
      const float* v = sV + j * pitch + c8;
#pragma unroll
      for (int k = 0; k < kMaxCols; ++k)
        if (8 * k < d) o[k] = fmaf(p, v[8 * k], o[k]);
    }
  }
  if (row >= seq.sq) return;
  const float inv = row_sum > 0.f ? 1.f / row_sum : 0.f;
  const int64_t ooff = row_off(c.o, b, seq.q_row0 + row, h) + c8;
#pragma unroll
  for (int k = 0; k < kMaxCols; ++k)
    if (8 * k < d) store_elem(c.o.ptr, c.o.elem, ooff + 8 * k, o[k] * inv, false);
  if (c8 == 0) c.lse.ptr[stat_off(c.lse, b, seq.q_row0 + row, h)] = row_sum > 0.f ? row_max + logf(row_sum) : -INFINITY;
}

// ---------------------------------------------------------------------------------------------------------------
// Backward.

struct SimtBwdArgs {
  EffBwdCall c;
  FlashStats delta;
};

// P of (row, key) from the raw dot product and the row's LSE (-inf: the row saw nothing, P = 0).
__device__ __forceinline__ float prob(const FlashShape& s, const Seq& seq, const EffBias& bias, int b, int h, int row,
                                      int key, float dot, float lse) {
  const float x = score(s, seq, bias, b, h, row, key, dot);
  return x == -INFINITY || lse == -INFINITY ? 0.f : expf(x - lse);
}

// dK/dV: one CTA per (key tile, kv head, sequence). Thread (r, c8) owns key r of the tile for the score tile
// (queries c8 + 8 kk) and for its dK/dV columns.
template <typename T>
__global__ void __launch_bounds__(kThreads) eff_simt_dkdv_kernel(SimtBwdArgs args) {
  extern __shared__ float smem_f[];
  const EffBwdCall& c = args.c;
  const FlashShape& s = c.s;
  const int d = s.head_dim, pitch = d + 1, group = s.heads_q / s.heads_kv;
  float* sK = smem_f;
  float* sV = sK + kTile * pitch;
  float* sQ = sV + kTile * pitch;
  float* sDO = sQ + kTile * pitch;
  float* sP = sDO + kTile * pitch;       // [key][query], pitch 33
  float* sDS = sP + kTile * (kTile + 1);  // [key][query], pitch 33
  float* sLse = sDS + kTile * (kTile + 1);
  float* sDelta = sLse + kTile;

  const int b = blockIdx.z, hk = blockIdx.y, n0 = blockIdx.x * kTile;
  const Seq seq = seq_of(s, b);
  if (n0 >= seq.skv) return;
  const int r = threadIdx.x / 8, c8 = threadIdx.x % 8, key = n0 + r;
  // Query tiles that see any of these keys (causally, and within a sliding window).
  const tile::TileRange tiles = tile::query_tiles(s, seq, n0, n0 + kTile, kTile);
  const int m_end = min(seq.sq, tiles.end * kTile);

  load_rows<T>(sK, pitch, c.k, b, seq.kv_row0, n0, seq.skv, hk, d);
  load_rows<T>(sV, pitch, c.v, b, seq.kv_row0, n0, seq.skv, hk, d);
  float dk[kMaxCols] = {}, dv[kMaxCols] = {};
  for (int h = hk * group; h < (hk + 1) * group; ++h) {
    for (int m0 = tiles.first * kTile; m0 < m_end; m0 += kTile) {
      __syncthreads();  // every thread is done with the previous Q/dO tile (and K/V are written, first time)
      load_rows<T>(sQ, pitch, c.q, b, seq.q_row0, m0, seq.sq, h, d);
      load_rows<T>(sDO, pitch, c.dout, b, seq.q_row0, m0, seq.sq, h, d);
      if (threadIdx.x < kTile) {
        const int i = m0 + threadIdx.x;
        const bool ok = i < seq.sq;
        sLse[threadIdx.x] = ok ? c.lse.ptr[stat_off(c.lse, b, seq.q_row0 + i, h)] : -INFINITY;
        sDelta[threadIdx.x] = ok ? args.delta.ptr[stat_off(args.delta, b, seq.q_row0 + i, h)] : 0.f;
      }
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const int qi = c8 + 8 * kk;
        const float qk = dot_rows(sK + r * pitch, sQ + qi * pitch, d);
        const float p = prob(s, seq, c.bias, b, h, m0 + qi, key, qk, sLse[qi]);
        const float dp = dot_rows(sV + r * pitch, sDO + qi * pitch, d);
        sP[r * (kTile + 1) + qi] = p;
        sDS[r * (kTile + 1) + qi] = p * (dp - sDelta[qi]);
      }
      __syncwarp();  // key r's P/dS row comes from the 8 lanes of this row
      for (int qi = 0; qi < kTile; ++qi) {
        const float p = sP[r * (kTile + 1) + qi], ds = sDS[r * (kTile + 1) + qi];
        const float* dorow = sDO + qi * pitch + c8;
        const float* qrow = sQ + qi * pitch + c8;
#pragma unroll
        for (int k = 0; k < kMaxCols; ++k) {
          if (8 * k >= d) continue;
          dv[k] = fmaf(p, dorow[8 * k], dv[k]);
          dk[k] = fmaf(ds, qrow[8 * k], dk[k]);
        }
      }
    }
  }
  if (key >= seq.skv) return;
  const int64_t koff = row_off(c.dk, b, seq.kv_row0 + key, hk) + c8;
  const int64_t voff = row_off(c.dv, b, seq.kv_row0 + key, hk) + c8;
#pragma unroll
  for (int k = 0; k < kMaxCols; ++k) {
    if (8 * k >= d) continue;
    store_elem(c.dk.ptr, c.dk.elem, koff + 8 * k, dk[k] * s.scale, c.accumulate);
    store_elem(c.dv.ptr, c.dv.elem, voff + 8 * k, dv[k], c.accumulate);
  }
}

// dQ: one CTA per (query tile, query head, sequence). Thread (r, c8) owns query row r.
template <typename T>
__global__ void __launch_bounds__(kThreads) eff_simt_dq_kernel(SimtBwdArgs args) {
  extern __shared__ float smem_f[];
  const EffBwdCall& c = args.c;
  const FlashShape& s = c.s;
  const int d = s.head_dim, pitch = d + 1;
  float* sQ = smem_f;
  float* sDO = sQ + kTile * pitch;
  float* sK = sDO + kTile * pitch;
  float* sV = sK + kTile * pitch;
  float* sDS = sV + kTile * pitch;  // [query][key], pitch 33

  const int b = blockIdx.z, h = blockIdx.y, hk = h / (s.heads_q / s.heads_kv);
  const int m0 = (gridDim.x - 1 - blockIdx.x) * kTile;
  const Seq seq = seq_of(s, b);
  if (m0 >= seq.sq) return;
  const int r = threadIdx.x / 8, c8 = threadIdx.x % 8, row = m0 + r;
  const int n_end = key_limit(s, seq, min(m0 + kTile, seq.sq) - 1);
  const bool row_ok = row < seq.sq;
  const float lse = row_ok ? c.lse.ptr[stat_off(c.lse, b, seq.q_row0 + row, h)] : -INFINITY;
  const float delta = row_ok ? args.delta.ptr[stat_off(args.delta, b, seq.q_row0 + row, h)] : 0.f;

  load_rows<T>(sQ, pitch, c.q, b, seq.q_row0, m0, seq.sq, h, d);
  load_rows<T>(sDO, pitch, c.dout, b, seq.q_row0, m0, seq.sq, h, d);
  float dq[kMaxCols] = {};
  for (int n0 = key_start(s, seq, m0) / kTile * kTile; n0 < n_end; n0 += kTile) {
    __syncthreads();
    load_rows<T>(sK, pitch, c.k, b, seq.kv_row0, n0, seq.skv, hk, d);
    load_rows<T>(sV, pitch, c.v, b, seq.kv_row0, n0, seq.skv, hk, d);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const int j = c8 + 8 * kk;
      const float p = prob(s, seq, c.bias, b, h, row, n0 + j, dot_rows(sQ + r * pitch, sK + j * pitch, d), lse);
      const float dp = dot_rows(sDO + r * pitch, sV + j * pitch, d);
      sDS[r * (kTile + 1) + j] = p * (dp - delta);
    }
    __syncwarp();
    for (int j = 0; j < kTile; ++j) {
      const float ds = sDS[r * (kTile + 1) + j];
      const float* krow = sK + j * pitch + c8;
#pragma unroll
      for (int k = 0; k < kMaxCols; ++k)
        if (8 * k < d) dq[k] = fmaf(ds, krow[8 * k], dq[k]);
    }
  }
  if (!row_ok) return;
  const int64_t off = row_off(c.dq, b, seq.q_row0 + row, h) + c8;
#pragma unroll
  for (int k = 0; k < kMaxCols; ++k)
    if (8 * k < d) store_elem(c.dq.ptr, c.dq.elem, off + 8 * k, dq[k] * s.scale, c.accumulate);
}

template <typename Kernel, typename Args>
void launch(Kernel kernel, const char* name, dim3 grid, int smem, cudaStream_t stream, const Args& args,
            const FlashShape& s) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
  if (smem > 48 * 1024)
    RT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
                  cat(name, ": setting ", smem, " bytes of shared memory"));
  kernel<<<grid, kThreads, smem, stream>>>(args);
  RT_CUDA_CHECK(cudaGetLastError(),
                cat("launching ", name, " grid (", grid.x, ", ", grid.y, ", ", grid.z, ")", flash_shape_str(s)));
}

int tile_floats(const FlashShape& s) { return kTile * (s.head_dim + 1); }

template <typename T>
void forward_typed(const EffFwdCall& c, cudaStream_t stream) {
  const int smem = (3 * tile_floats(c.s) + kTile * (kTile + 1)) * 4;
  const dim3 grid((c.s.seqlen_q + kTile - 1) / kTile, c.s.heads_q, c.s.batch);
  launch(eff_simt_fwd_kernel<T>, "eff_simt_fwd_kernel", grid, smem, stream, c, c.s);
}

template <typename T>
void backward_typed(const EffBwdCall& c, cudaStream_t stream) {
  const FlashShape& s = c.s;
  SimtBwdArgs args{c, {}};
  const int64_t rows = s.total_q;
  StreamScratch delta_buf(static_cast<size_t>(rows * s.heads_q) * 4, stream, "efficient backward Delta");
  args.delta.ptr = reinterpret_cast<float*>(delta_buf.bytes());
  args.delta.row_stride = 1;
  args.delta.head_stride = s.cu_q ? rows : s.seqlen_q;
  args.delta.batch_stride = s.cu_q ? 0 : int64_t(s.heads_q) * s.seqlen_q;
  efficient_delta(c, args.delta, stream);

  const int dkdv_smem = (4 * tile_floats(s) + 2 * kTile * (kTile + 1) + 2 * kTile) * 4;
  launch(eff_simt_dkdv_kernel<T>, "eff_simt_dkdv_kernel", dim3((s.seqlen_kv + kTile - 1) / kTile, s.heads_kv, s.batch),
         dkdv_smem, stream, args, s);
  const int dq_smem = (4 * tile_floats(s) + kTile * (kTile + 1)) * 4;
  launch(eff_simt_dq_kernel<T>, "eff_simt_dq_kernel", dim3((s.seqlen_q + kTile - 1) / kTile, s.heads_q, s.batch),
         dq_smem, stream, args, s);
}

}  // namespace

void efficient_forward_simt(const EffFwdCall& c, cudaStream_t stream) {
  switch (c.elem) {
    case FlashElem::F32: forward_typed<float>(c, stream); break;
    case FlashElem::BF16: forward_typed<__nv_bfloat16>(c, stream); break;
    case FlashElem::F16: forward_typed<__half>(c, stream); break;
  }
}

void efficient_backward_simt(const EffBwdCall& c, cudaStream_t stream) {
  switch (c.elem) {
    case FlashElem::F32: backward_typed<float>(c, stream); break;
    case FlashElem::BF16: backward_typed<__nv_bfloat16>(c, stream); break;
    case FlashElem::F16: backward_typed<__half>(c, stream); break;
  }
}

}  // namespace ringtrain::attention::cuda
