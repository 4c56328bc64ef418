// `efficient` on tensor cores: bf16/fp16, head dim a multiple of 8 up to 128, zero-padded to DP = 64 or 128 in
// shared memory (padding columns add nothing to Q K^T or dO V^T; O/dQ/dK/dV columns >= head_dim are never stored).
// The structure is the flash kernels' (flash_fwd.cu, flash_bwd.cu), read them first; what differs here:
//  - the additive bias: added to the raw scores as bias / scale, so that the no-bias arithmetic is unchanged and
//    -inf entries stay -inf; a row whose visible scores are all -inf ends with l = 0 (O = 0, LSE = -inf);
//  - the padded head dimension (load_tile_padded, guarded stores).
// Indices into tensors are int64 throughout (a 131072 x 131072 bias has 2^34 entries per head).
#include "ringtrain/attention/cuda/cuda_util.h"
#include "ringtrain/attention/cuda/efficient_device.cuh"

namespace ringtrain::attention::cuda {
namespace {

using namespace tile;
using eff::bias_row_off;
using eff::load_bias;
using eff::load_tile_padded;

std::string shape_str(const FlashShape& s) {
  return cat(" for B=", s.batch, " Hq=", s.heads_q, " Hkv=", s.heads_kv, " D=", s.head_dim, " Sq=", s.seqlen_q,
             " Skv=", s.seqlen_kv);
}

template <typename Kernel, typename Args>
void launch(Kernel kernel, const char* name, dim3 grid, int threads, int smem, cudaStream_t stream, const Args& args,
            const FlashShape& s) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;  // e.g. no keys: nothing to compute, nothing to store
  if (smem > 48 * 1024)
    RT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
                  cat(name, ": setting ", smem, " bytes of shared memory"));
  kernel<<<grid, threads, smem, stream>>>(args);
  RT_CUDA_CHECK(cudaGetLastError(),
                cat("launching ", name, " grid (", grid.x, ", ", grid.y, ", ", grid.z, ")", shape_str(s)));
}

// ---------------------------------------------------------------------------------------------------------------
// Forward: one CTA per (query tile of BM rows, query head, sequence); each warp owns MT 16-row slices.

template <int DP, int kWarps, int MT, int BN>
struct FwdConfig {
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int BM = 16 * MT * kWarps;
  static constexpr int kSmemBytes = (BM + 2 * BN) * DP * 2;
};

// kBias is a template parameter so that the no-bias kernel carries no bias code (registers are tight at DP = 128).
template <typename T, int DP, int kWarps, int MT, int BN, bool kBias>
__global__ void __launch_bounds__(32 * kWarps, 1) eff_fwd_kernel(EffFwdCall c) {
  using Cfg = FwdConfig<DP, kWarps, MT, BN>;
  constexpr int BM = Cfg::BM, kThreads = Cfg::kThreads;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sQ = smem_u32(smem), sK = sQ + BM * DP * 2, sV = sK + BN * DP * 2;

  const FlashShape& s = c.s;
  const int b = blockIdx.z, h = blockIdx.y, hk = h / (s.heads_q / s.heads_kv);
  const int m0 = (gridDim.x - 1 - blockIdx.x) * BM;  // the longest causal tiles start first
  const Seq seq = seq_of(s, b);
  if (m0 >= seq.sq) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int rows_valid = min(BM, seq.sq - m0);
  const int chunks = s.head_dim / 8;
  const float inv_scale = 1.f / s.scale;

  // Keys any row of the tile may see: [0, n_end).
  const int n_end = key_limit(s, seq, m0 + rows_valid - 1);
  const int n_tiles = (n_end + BN - 1) / BN;

  const uint16_t* gq = static_cast<const uint16_t*>(c.q.ptr) + row_off(c.q, b, seq.q_row0 + m0, h);
  const uint16_t* gk = static_cast<const uint16_t*>(c.k.ptr) + row_off(c.k, b, seq.kv_row0, hk);
  const uint16_t* gv = static_cast<const uint16_t*>(c.v.ptr) + row_off(c.v, b, seq.kv_row0, hk);

  float o[MT][DP / 8][4] = {};
  float row_max[MT][2], row_sum[MT][2] = {};
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) row_max[mt][0] = row_max[mt][1] = -INFINITY;
  const float scale_log2 = s.scale * kLog2e;

  if (n_tiles > 0) {
    load_tile_padded<BM, DP, kThreads>(sQ, gq, c.q.row_stride, rows_valid, chunks);
    load_tile_padded<BN, DP, kThreads>(sK, gk, c.k.row_stride, min(BN, seq.skv), chunks);
    cp_async_commit();
  }
  for (int nb = 0; nb < n_tiles; ++nb) {
    const int n0 = nb * BN;
    cp_async_wait_all();
    __syncthreads();  // K_n visible; every warp is done with V_{n-1}
    load_tile_padded<BN, DP, kThreads>(sV, gv + int64_t(n0) * c.v.row_stride, c.v.row_stride, seq.skv - n0, chunks);
    cp_async_commit();

    float sc[MT][BN / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < DP / 16; ++kk) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) ldsm_x4(a_addr<DP>(sQ, (warp * MT + mt) * 16, kk * 16, lane), a[mt]);
#pragma unroll
      for (int np = 0; np < BN / 16; ++np) {
        uint32_t bk[4];
        ldsm_x4(bt_addr<DP>(sK, np * 16, kk * 16, lane), bk);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma<T>(sc[mt][2 * np], a[mt], bk[0], bk[1]);
          mma<T>(sc[mt][2 * np + 1], a[mt], bk[2], bk[3]);
        }
      }
    }

    cp_async_wait_all();
    __syncthreads();  // V_n visible; every warp is done with K_n
    if (nb + 1 < n_tiles) {
      load_tile_padded<BN, DP, kThreads>(sK, gk + int64_t(n0 + BN) * c.k.row_stride, c.k.row_stride,
                                         seq.skv - n0 - BN, chunks);
      cp_async_commit();
    }

    // Bias (rows and keys in range), then mask keys past the sequence end or past a row's causal limit (only tiles
    // that reach them).
    const bool need_mask = n0 + BN > seq.skv || (s.mask != kMaskNone && n0 + BN > m0 + 1 + seq.shift);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = m0 + (warp * MT + mt) * 16 + g + 8 * half;
        if (kBias && row < seq.sq) {
          const int64_t boff = bias_row_off(c.bias, b, h, row);
#pragma unroll
          for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int key = n0 + nt * 8 + 2 * t + e;
              if (key < seq.skv)
                sc[mt][nt][2 * half + e] += load_bias(c.bias, boff + key * c.bias.col_stride) * inv_scale;
            }
          }
        }
        const int lim = need_mask ? key_limit(s, seq, row) : seq.skv;
        float mx = row_max[mt][half];
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& x = sc[mt][nt][2 * half + e];
            if (need_mask && n0 + nt * 8 + 2 * t + e >= lim) x = -INFINITY;
            mx = fmaxf(mx, x);
          }
        }
        mx = quad_max(mx);
        // A row that has seen no finite score yet keeps max -inf; use 0 so that exp2 gives 0, not NaN.
        const float m_use = mx == -INFINITY ? 0.f : mx * scale_log2;
        const float alpha = exp2f(row_max[mt][half] * scale_log2 - m_use);
        row_max[mt][half] = mx;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& x = sc[mt][nt][2 * half + e];
            x = exp2f(x * scale_log2 - m_use);
            sum += x;
          }
        }
        row_sum[mt][half] = row_sum[mt][half] * alpha + sum;
#pragma unroll
        for (int dt = 0; dt < DP / 8; ++dt) {
          o[mt][dt][2 * half] *= alpha;
          o[mt][dt][2 * half + 1] *= alpha;
        }
      }
    }

#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) c_to_a<T>(sc[mt][2 * kk], sc[mt][2 * kk + 1], a[mt]);
#pragma unroll
      for (int dp = 0; dp < DP / 16; ++dp) {
        uint32_t bv[4];
        ldsm_x4_trans(b_addr_trans<DP>(sV, kk * 16, dp * 16, lane), bv);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma<T>(o[mt][2 * dp], a[mt], bv[0], bv[1]);
          mma<T>(o[mt][2 * dp + 1], a[mt], bv[2], bv[3]);
        }
      }
    }
  }

  // O = acc / l (0 for a row that saw no finite score), LSE = max * scale + ln(l) (-inf for such a row).
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = m0 + (warp * MT + mt) * 16 + g + 8 * half;
      const float l = quad_sum(row_sum[mt][half]);
      if (row >= seq.sq) continue;
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const int64_t ooff = row_off(c.o, b, seq.q_row0 + row, h);
#pragma unroll
      for (int dt = 0; dt < DP / 8; ++dt)
        if (dt < chunks)
          store_pair<T>(c.o.ptr, c.o.elem, ooff + dt * 8 + 2 * t, o[mt][dt][2 * half] * inv,
                        o[mt][dt][2 * half + 1] * inv, false);
      if (t == 0)
        c.lse.ptr[stat_off(c.lse, b, seq.q_row0 + row, h)] =
            l > 0.f ? (row_max[mt][half] * scale_log2 + __log2f(l)) * kLn2 : -INFINITY;
    }
  }
}

template <typename T, int DP>
void forward_dp(const EffFwdCall& c, cudaStream_t stream) {
  constexpr int kWarps = 4, MT = 2, BN = 64;
  using Cfg = FwdConfig<DP, kWarps, MT, BN>;
  const dim3 grid((c.s.seqlen_q + Cfg::BM - 1) / Cfg::BM, c.s.heads_q, c.s.batch);
  if (c.bias.ptr)
    launch(eff_fwd_kernel<T, DP, kWarps, MT, BN, true>, "eff_fwd_kernel<bias>", grid, Cfg::kThreads,
           Cfg::kSmemBytes, stream, c, c.s);
  else
    launch(eff_fwd_kernel<T, DP, kWarps, MT, BN, false>, "eff_fwd_kernel", grid, Cfg::kThreads, Cfg::kSmemBytes,
           stream, c, c.s);
}

template <typename T>
void forward_typed(const EffFwdCall& c, cudaStream_t stream) {
  if (c.s.head_dim <= 64) forward_dp<T, 64>(c, stream);
  else forward_dp<T, 128>(c, stream);
}

// ---------------------------------------------------------------------------------------------------------------
// Backward. delta (rowsum(dO * O)) first; then one CTA per (key tile, kv head, sequence) accumulates dK/dV in
// registers over the query tiles of every query head of the group; dQ either with fp32 atomics from the same CTA
// (fast mode) or by a second kernel per query tile (deterministic mode).

struct BwdArgs {
  EffBwdCall c;
  FlashStats delta;
  FlashRows dq_acc;  // fp32 target of the atomic dQ adds
};

__device__ __forceinline__ float lse_log2(float lse) { return lse == -INFINITY ? INFINITY : lse * kLog2e; }

template <int DP, int kWarps, int BM, bool kAtomicDq>
struct DkdvConfig {
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int BN = 16 * kWarps;
  static constexpr int kTileQ = BM * DP * 2;
  static constexpr int kSmemBytes = 2 * BN * DP * 2 + 4 * kTileQ + 4 * BM * 4 + (kAtomicDq ? BN * BM * 2 : 0);
  static constexpr int WM = BM / 16, WD = kWarps / WM, DW = DP / WD;
  static_assert(kWarps % WM == 0 && DW % 16 == 0, "dQ warp split");
};

template <typename T, int DP, int kWarps, int BM, bool kAtomicDq>
__global__ void __launch_bounds__(32 * kWarps, 1) eff_bwd_dkdv_kernel(BwdArgs args) {
  using Cfg = DkdvConfig<DP, kWarps, BM, kAtomicDq>;
  constexpr int BN = Cfg::BN, kThreads = Cfg::kThreads;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sK = smem_u32(smem), sV = sK + BN * DP * 2, sQ0 = sV + BN * DP * 2;
  const uint32_t sDO0 = sQ0 + 2 * Cfg::kTileQ, sStat = sDO0 + 2 * Cfg::kTileQ;
  const uint32_t sDS = sStat + 4 * BM * 4;
  // sStat holds, per buffer, BM LSE values then BM Delta values.
  const float* stat = reinterpret_cast<const float*>(smem + (sStat - sK));

  const EffBwdCall& c = args.c;
  const FlashShape& s = c.s;
  const int group = s.heads_q / s.heads_kv;
  const int b = blockIdx.z, hk = blockIdx.y, n0 = blockIdx.x * BN;
  const Seq seq = seq_of(s, b);
  if (n0 >= seq.skv) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const bool causal = s.mask != kMaskNone;
  const int chunks = s.head_dim / 8;
  const bool has_bias = c.bias.ptr != nullptr;
  const float inv_scale = 1.f / s.scale;

  // Query tiles that see any of these keys: row i sees key n0 when i + 1 + shift > n0.
  const int mb_first = causal ? max(0, n0 - seq.shift) / BM : 0;
  const int mb_count = max(0, (seq.sq + BM - 1) / BM - mb_first);
  const int steps = group * mb_count;

  auto prefetch = [&](int step, int buf) {
    const int h = hk * group + step / mb_count, m0 = (mb_first + step % mb_count) * BM;
    const int rows = seq.sq - m0;
    load_tile_padded<BM, DP, kThreads>(sQ0 + buf * Cfg::kTileQ,
                                       static_cast<const uint16_t*>(c.q.ptr) + row_off(c.q, b, seq.q_row0 + m0, h),
                                       c.q.row_stride, rows, chunks);
    load_tile_padded<BM, DP, kThreads>(
        sDO0 + buf * Cfg::kTileQ, static_cast<const uint16_t*>(c.dout.ptr) + row_off(c.dout, b, seq.q_row0 + m0, h),
        c.dout.row_stride, rows, chunks);
    for (int r = threadIdx.x; r < 2 * BM; r += kThreads) {
      const int i = r % BM;
      const FlashStats& src = r < BM ? c.lse : args.delta;
      const bool ok = i < rows;
      cp_async4(sStat + (buf * 2 * BM + r) * 4, ok ? src.ptr + stat_off(src, b, seq.q_row0 + m0 + i, h) : src.ptr, ok);
    }
  };

  const int keys = seq.skv - n0;
  load_tile_padded<BN, DP, kThreads>(
      sK, static_cast<const uint16_t*>(c.k.ptr) + row_off(c.k, b, seq.kv_row0 + n0, hk), c.k.row_stride, keys, chunks);
  load_tile_padded<BN, DP, kThreads>(
      sV, static_cast<const uint16_t*>(c.v.ptr) + row_off(c.v, b, seq.kv_row0 + n0, hk), c.v.row_stride, keys, chunks);
  if (steps > 0) prefetch(0, 0);
  cp_async_commit();

  const float scale_log2 = s.scale * kLog2e;
  float dk[DP / 8][4] = {}, dv[DP / 8][4] = {};

  for (int step = 0; step < steps; ++step) {
    const int buf = step & 1;
    const int h = hk * group + step / mb_count, m0 = (mb_first + step % mb_count) * BM;
    const uint32_t sQ = sQ0 + buf * Cfg::kTileQ, sDO = sDO0 + buf * Cfg::kTileQ;
    const float* sLse = stat + buf * 2 * BM;
    const float* sDelta = sLse + BM;
    cp_async_wait_all();
    __syncthreads();  // this step's tiles visible; every warp is done with the previous step
    if (step + 1 < steps) {
      prefetch(step + 1, buf ^ 1);
      cp_async_commit();
    }

    // S^T = K Q^T (this warp's 16 keys x BM queries), then P^T.
    float p[BM / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < DP / 16; ++kk) {
      uint32_t a[4];
      ldsm_x4(a_addr<DP>(sK, warp * 16, kk * 16, lane), a);
#pragma unroll
      for (int np = 0; np < BM / 16; ++np) {
        uint32_t bq[4];
        ldsm_x4(bt_addr<DP>(sQ, np * 16, kk * 16, lane), bq);
        mma<T>(p[2 * np], a, bq[0], bq[1]);
        mma<T>(p[2 * np + 1], a, bq[2], bq[3]);
      }
    }
    const bool need_mask = m0 + BM > seq.sq || n0 + BN > seq.skv || (causal && n0 + BN > m0 + 1 + seq.shift);
#pragma unroll
    for (int nt = 0; nt < BM / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = nt * 8 + 2 * t + (e & 1);
        const int key = n0 + warp * 16 + g + 8 * (e >> 1), row = m0 + col;
        const bool in_range = row < seq.sq && key < seq.skv;
        const bool visible = !need_mask || (in_range && key < key_limit(s, seq, row));
        float x = p[nt][e];
        if (has_bias && in_range)
          x += load_bias(c.bias, bias_row_off(c.bias, b, h, row) + key * c.bias.col_stride) * inv_scale;
        p[nt][e] = visible ? exp2f(x * scale_log2 - lse_log2(sLse[col])) : 0.f;
      }
    }

    // dV += P^T dO
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) {
      uint32_t a[4];
      c_to_a<T>(p[2 * kk], p[2 * kk + 1], a);
#pragma unroll
      for (int dp = 0; dp < DP / 16; ++dp) {
        uint32_t bo[4];
        ldsm_x4_trans(b_addr_trans<DP>(sDO, kk * 16, dp * 16, lane), bo);
        mma<T>(dv[2 * dp], a, bo[0], bo[1]);
        mma<T>(dv[2 * dp + 1], a, bo[2], bo[3]);
      }
    }

    // dP^T = V dO^T, then dS^T = P^T (dP^T - Delta) * scale, in place.
    float ds[BM / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < DP / 16; ++kk) {
      uint32_t a[4];
      ldsm_x4(a_addr<DP>(sV, warp * 16, kk * 16, lane), a);
#pragma unroll
      for (int np = 0; np < BM / 16; ++np) {
        uint32_t bo[4];
        ldsm_x4(bt_addr<DP>(sDO, np * 16, kk * 16, lane), bo);
        mma<T>(ds[2 * np], a, bo[0], bo[1]);
        mma<T>(ds[2 * np + 1], a, bo[2], bo[3]);
      }
    }
#pragma unroll
    for (int nt = 0; nt < BM / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) ds[nt][e] = p[nt][e] * (ds[nt][e] - sDelta[nt * 8 + 2 * t + (e & 1)]) * s.scale;
    }

    // dK += dS^T Q
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) {
      uint32_t a[4];
      c_to_a<T>(ds[2 * kk], ds[2 * kk + 1], a);
#pragma unroll
      for (int dp = 0; dp < DP / 16; ++dp) {
        uint32_t bq[4];
        ldsm_x4_trans(b_addr_trans<DP>(sQ, kk * 16, dp * 16, lane), bq);
        mma<T>(dk[2 * dp], a, bq[0], bq[1]);
        mma<T>(dk[2 * dp + 1], a, bq[2], bq[3]);
      }
    }

    if constexpr (kAtomicDq) {
      // dS^T to shared memory ([key][query]), then dQ[BM x DP] += dS K, added to the fp32 buffer.
#pragma unroll
      for (int nt = 0; nt < BM / 8; ++nt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = warp * 16 + g + 8 * half, col = nt * 8 + 2 * t;
          const uint32_t addr = sDS + swz<BM>(row, col / 8) + (col % 8) * 2;
          asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(pack2<T>(ds[nt][2 * half], ds[nt][2 * half + 1])));
        }
      }
      __syncthreads();
      const int wm = warp % Cfg::WM, d0 = (warp / Cfg::WM) * Cfg::DW;
      float dq[Cfg::DW / 8][4] = {};
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        uint32_t a[4];
        ldsm_x4_trans(a_addr_trans<BM>(sDS, kk * 16, wm * 16, lane), a);
#pragma unroll
        for (int dp = 0; dp < Cfg::DW / 16; ++dp) {
          uint32_t bk[4];
          ldsm_x4_trans(b_addr_trans<DP>(sK, kk * 16, d0 + dp * 16, lane), bk);
          mma<T>(dq[2 * dp], a, bk[0], bk[1]);
          mma<T>(dq[2 * dp + 1], a, bk[2], bk[3]);
        }
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = m0 + wm * 16 + g + 8 * half;
        if (row >= seq.sq) continue;
        float* dst = static_cast<float*>(args.dq_acc.ptr) + row_off(args.dq_acc, b, seq.q_row0 + row, h) + d0 + 2 * t;
#pragma unroll
        for (int dt = 0; dt < Cfg::DW / 8; ++dt) {
          if (d0 + dt * 8 >= s.head_dim) continue;
          atomicAdd(dst + dt * 8, dq[dt][2 * half]);
          atomicAdd(dst + dt * 8 + 1, dq[dt][2 * half + 1]);
        }
      }
    }
  }

#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int key = n0 + warp * 16 + g + 8 * half;
    if (key >= seq.skv) continue;
    const int64_t koff = row_off(c.dk, b, seq.kv_row0 + key, hk) + 2 * t;
    const int64_t voff = row_off(c.dv, b, seq.kv_row0 + key, hk) + 2 * t;
#pragma unroll
    for (int dt = 0; dt < DP / 8; ++dt) {
      if (dt >= chunks) continue;
      store_pair<T>(c.dk.ptr, c.dk.elem, koff + dt * 8, dk[dt][2 * half], dk[dt][2 * half + 1], c.accumulate);
      store_pair<T>(c.dv.ptr, c.dv.elem, voff + dt * 8, dv[dt][2 * half], dv[dt][2 * half + 1], c.accumulate);
    }
  }
}

template <int DP, int kWarps, int BN>
struct DqConfig {
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int BM = 16 * kWarps;
  static constexpr int kSmemBytes = 2 * BM * DP * 2 + 4 * BN * DP * 2;
};

// Deterministic dQ: one CTA per (query tile, head, sequence), each warp 16 rows, K/V tiles double-buffered.
template <typename T, int DP, int kWarps, int BN>
__global__ void __launch_bounds__(32 * kWarps, 1) eff_bwd_dq_kernel(BwdArgs args) {
  using Cfg = DqConfig<DP, kWarps, BN>;
  constexpr int BM = Cfg::BM, kThreads = Cfg::kThreads, kTileKV = BN * DP * 2;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sQ = smem_u32(smem), sDO = sQ + BM * DP * 2, sKV0 = sDO + BM * DP * 2;

  const EffBwdCall& c = args.c;
  const FlashShape& s = c.s;
  const int b = blockIdx.z, h = blockIdx.y, hk = h / (s.heads_q / s.heads_kv);
  const int m0 = (gridDim.x - 1 - blockIdx.x) * BM;
  const Seq seq = seq_of(s, b);
  if (m0 >= seq.sq) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int rows_valid = min(BM, seq.sq - m0);
  const int n_tiles = (key_limit(s, seq, m0 + rows_valid - 1) + BN - 1) / BN;
  const int chunks = s.head_dim / 8;
  const bool has_bias = c.bias.ptr != nullptr;
  const float inv_scale = 1.f / s.scale;

  const uint16_t* gk = static_cast<const uint16_t*>(c.k.ptr) + row_off(c.k, b, seq.kv_row0, hk);
  const uint16_t* gv = static_cast<const uint16_t*>(c.v.ptr) + row_off(c.v, b, seq.kv_row0, hk);
  auto prefetch = [&](int nb, int buf) {
    const int64_t n0 = int64_t(nb) * BN;
    load_tile_padded<BN, DP, kThreads>(sKV0 + (2 * buf) * kTileKV, gk + n0 * c.k.row_stride, c.k.row_stride,
                                       seq.skv - nb * BN, chunks);
    load_tile_padded<BN, DP, kThreads>(sKV0 + (2 * buf + 1) * kTileKV, gv + n0 * c.v.row_stride, c.v.row_stride,
                                       seq.skv - nb * BN, chunks);
  };
  if (n_tiles > 0) {
    load_tile_padded<BM, DP, kThreads>(sQ, static_cast<const uint16_t*>(c.q.ptr) + row_off(c.q, b, seq.q_row0 + m0, h),
                                       c.q.row_stride, rows_valid, chunks);
    load_tile_padded<BM, DP, kThreads>(
        sDO, static_cast<const uint16_t*>(c.dout.ptr) + row_off(c.dout, b, seq.q_row0 + m0, h), c.dout.row_stride,
        rows_valid, chunks);
    prefetch(0, 0);
    cp_async_commit();
  }

  float row_lse2[2], row_delta[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = min(m0 + warp * 16 + g + 8 * half, seq.sq - 1);
    row_lse2[half] = lse_log2(c.lse.ptr[stat_off(c.lse, b, seq.q_row0 + row, h)]);
    row_delta[half] = args.delta.ptr[stat_off(args.delta, b, seq.q_row0 + row, h)];
  }
  const float scale_log2 = s.scale * kLog2e;
  float dq[DP / 8][4] = {};

  for (int nb = 0; nb < n_tiles; ++nb) {
    const int n0 = nb * BN, buf = nb & 1;
    const uint32_t sK = sKV0 + (2 * buf) * kTileKV, sV = sK + kTileKV;
    cp_async_wait_all();
    __syncthreads();
    if (nb + 1 < n_tiles) {
      prefetch(nb + 1, buf ^ 1);
      cp_async_commit();
    }
    float p[BN / 8][4] = {}, ds[BN / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < DP / 16; ++kk) {
      uint32_t aq[4], ao[4];
      ldsm_x4(a_addr<DP>(sQ, warp * 16, kk * 16, lane), aq);
      ldsm_x4(a_addr<DP>(sDO, warp * 16, kk * 16, lane), ao);
#pragma unroll
      for (int np = 0; np < BN / 16; ++np) {
        uint32_t bk[4], bv[4];
        ldsm_x4(bt_addr<DP>(sK, np * 16, kk * 16, lane), bk);
        ldsm_x4(bt_addr<DP>(sV, np * 16, kk * 16, lane), bv);
        mma<T>(p[2 * np], aq, bk[0], bk[1]);
        mma<T>(p[2 * np + 1], aq, bk[2], bk[3]);
        mma<T>(ds[2 * np], ao, bv[0], bv[1]);
        mma<T>(ds[2 * np + 1], ao, bv[2], bv[3]);
      }
    }
    const bool need_mask =
        m0 + BM > seq.sq || n0 + BN > seq.skv || (s.mask != kMaskNone && n0 + BN > m0 + 1 + seq.shift);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = m0 + warp * 16 + g + 8 * half;
      const int lim = row < seq.sq ? key_limit(s, seq, row) : 0;
      const int64_t boff = has_bias && row < seq.sq ? bias_row_off(c.bias, b, h, row) : 0;
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = n0 + nt * 8 + 2 * t + e;
          const bool visible = !need_mask || key < lim;
          float x = p[nt][2 * half + e];
          if (has_bias && row < seq.sq && key < seq.skv)
            x += load_bias(c.bias, boff + key * c.bias.col_stride) * inv_scale;
          const float pv = visible ? exp2f(x * scale_log2 - row_lse2[half]) : 0.f;
          ds[nt][2 * half + e] = pv * (ds[nt][2 * half + e] - row_delta[half]) * s.scale;
        }
      }
    }
    // dQ += dS K
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t a[4];
      c_to_a<T>(ds[2 * kk], ds[2 * kk + 1], a);
#pragma unroll
      for (int dp = 0; dp < DP / 16; ++dp) {
        uint32_t bk[4];
        ldsm_x4_trans(b_addr_trans<DP>(sK, kk * 16, dp * 16, lane), bk);
        mma<T>(dq[2 * dp], a, bk[0], bk[1]);
        mma<T>(dq[2 * dp + 1], a, bk[2], bk[3]);
      }
    }
  }

#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = m0 + warp * 16 + g + 8 * half;
    if (row >= seq.sq) continue;
    const int64_t off = row_off(c.dq, b, seq.q_row0 + row, h) + 2 * t;
#pragma unroll
    for (int dt = 0; dt < DP / 8; ++dt)
      if (dt < chunks)
        store_pair<T>(c.dq.ptr, c.dq.elem, off + dt * 8, dq[dt][2 * half], dq[dt][2 * half + 1], c.accumulate);
  }
}

// dq = the fp32 atomic buffer (contiguous [rows, Hq, head_dim]), in dq's dtype and strides.
template <typename T>
__global__ void eff_dq_convert_kernel(BwdArgs args) {
  const EffBwdCall& c = args.c;
  const int64_t pair = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int half_d = c.s.head_dim / 2;
  if (pair >= c.s.total_q * c.s.heads_q * half_d) return;
  const int d = static_cast<int>(pair % half_d) * 2;
  const int h = static_cast<int>((pair / half_d) % c.s.heads_q);
  const int64_t r = pair / half_d / c.s.heads_q;
  const int b = c.s.cu_q ? 0 : static_cast<int>(r / c.s.seqlen_q);
  const int64_t i = c.s.cu_q ? r : r % c.s.seqlen_q;
  const float2 v = *reinterpret_cast<const float2*>(static_cast<const float*>(args.dq_acc.ptr) + pair * 2);
  store_pair<T>(c.dq.ptr, c.dq.elem, row_off(c.dq, b, i, h) + d, v.x, v.y, false);
}

template <typename T, int DP>
void backward_dp(const EffBwdCall& c, cudaStream_t stream) {
  const FlashShape& s = c.s;
  BwdArgs args{c, {}, {}};
  const int64_t rows = s.total_q;
  StreamScratch delta_buf(static_cast<size_t>(rows * s.heads_q) * 4, stream, "efficient backward Delta");
  args.delta.ptr = reinterpret_cast<float*>(delta_buf.bytes());
  args.delta.row_stride = 1;
  args.delta.head_stride = s.cu_q ? rows : s.seqlen_q;
  args.delta.batch_stride = s.cu_q ? 0 : int64_t(s.heads_q) * s.seqlen_q;
  efficient_delta(c, args.delta, stream);

  constexpr int kWarps = 8, BM = 64;
  const dim3 kv_grid((s.seqlen_kv + 16 * kWarps - 1) / (16 * kWarps), s.heads_kv, s.batch);
  if (c.deterministic) {
    using Cfg = DkdvConfig<DP, kWarps, BM, false>;
    launch(eff_bwd_dkdv_kernel<T, DP, kWarps, BM, false>, "eff_bwd_dkdv_kernel", kv_grid, Cfg::kThreads,
           Cfg::kSmemBytes, stream, args, s);
    using QCfg = DqConfig<DP, 4, 64>;
    const dim3 q_grid((s.seqlen_q + QCfg::BM - 1) / QCfg::BM, s.heads_q, s.batch);
    launch(eff_bwd_dq_kernel<T, DP, 4, 64>, "eff_bwd_dq_kernel", q_grid, QCfg::kThreads, QCfg::kSmemBytes, stream,
           args, s);
    return;
  }
  // Fast mode: dQ is added with atomics into dq itself (accumulate, fp32) or into a zeroed fp32 buffer.
  const bool direct = c.accumulate;
  const size_t acc_bytes = direct ? 0 : static_cast<size_t>(rows * s.heads_q * s.head_dim) * 4;
  StreamScratch acc_buf(acc_bytes, stream, "efficient backward dQ accumulator");
  if (direct) {
    args.dq_acc = c.dq;
  } else {
    args.dq_acc.ptr = acc_buf.bytes();
    args.dq_acc.elem = FlashElem::F32;
    args.dq_acc.head_stride = s.head_dim;
    args.dq_acc.row_stride = int64_t(s.heads_q) * s.head_dim;
    args.dq_acc.batch_stride = s.cu_q ? 0 : int64_t(s.seqlen_q) * args.dq_acc.row_stride;
    if (acc_bytes > 0)
      RT_CUDA_CHECK(cudaMemsetAsync(acc_buf.bytes(), 0, acc_bytes, stream),
                    cat("zeroing the efficient dQ accumulator", shape_str(s)));
  }
  using Cfg = DkdvConfig<DP, kWarps, BM, true>;
  launch(eff_bwd_dkdv_kernel<T, DP, kWarps, BM, true>, "eff_bwd_dkdv_kernel", kv_grid, Cfg::kThreads,
         Cfg::kSmemBytes, stream, args, s);
  if (!direct && acc_bytes > 0) {
    const int64_t pairs = rows * s.heads_q * s.head_dim / 2;
    launch(eff_dq_convert_kernel<T>, "eff_dq_convert_kernel", dim3(static_cast<unsigned>((pairs + 255) / 256)), 256,
           0, stream, args, s);
  }
}

template <typename T>
void backward_typed(const EffBwdCall& c, cudaStream_t stream) {
  if (c.s.head_dim <= 64) backward_dp<T, 64>(c, stream);
  else backward_dp<T, 128>(c, stream);
}

}  // namespace

void efficient_forward_tc(const EffFwdCall& c, cudaStream_t stream) {
  if (c.s.seqlen_q == 0) return;
  if (c.s.bf16) forward_typed<__nv_bfloat16>(c, stream);
  else forward_typed<__half>(c, stream);
}

void efficient_backward_tc(const EffBwdCall& c, cudaStream_t stream) {
  if (c.s.total_q == 0 && c.s.seqlen_kv == 0) return;
  if (c.s.bf16) backward_typed<__nv_bfloat16>(c, stream);
  else backward_typed<__half>(c, stream);
}

}  // namespace ringtrain::attention::cuda
