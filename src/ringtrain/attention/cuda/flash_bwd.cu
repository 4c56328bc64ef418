// Tensor-core backward of `efficient` for 16-bit inputs, and of `flash` in deterministic mode (flash_tile.cuh: the
// variants), FlashAttention-2 structure on mma.sync tensor cores; flash's fast mode runs the Hopper kernels of
// flash_bwd_sm90.cu after step 1:
//  1. delta_kernel: Delta = rowsum(dO * O) per (row, head), fp32 (also the efficient SIMT backward's first step).
//  2. flash_bwd_dkdv_kernel: one CTA per (key tile of BN = 16 * warps keys, kv head, sequence); each warp owns 16
//     keys and keeps their dK/dV in registers while the CTA walks every query tile of every query head of the
//     GQA group (Q/dO double-buffered through cp.async). The warp computes S^T = K Q^T and dP^T = V dO^T, so P^T
//     and dS^T are already in the A-operand layout for dV += P^T dO and dK += dS^T Q.
//     Fast mode (efficient): dS^T also goes to shared memory and dQ += dS K is added to an fp32 buffer with atomics.
//  3. Deterministic mode instead runs flash_bwd_dq_kernel: one CTA per query tile, recomputing P and dS over the
//     key tiles (dQ in registers, no atomics).
// Query tiles that see none of a CTA's keys (past them causally, or past a sliding window), and key tiles that none of
// a CTA's rows see, are skipped.
// dS carries the softmax scale, so dK = dS^T Q and dQ = dS K need none.
#include "ringtrain/attention/cuda/cuda_util.h"
#include "ringtrain/attention/cuda/efficient_device.cuh"
#include "ringtrain/attention/cuda/flash_sm90.h"

namespace ringtrain::attention::cuda {
namespace {

using namespace tile;

template <typename Call>
struct BwdKernelArgs {
  Call c;
  FlashStats delta;  // rowsum(dO * O), LSE-shaped
  FlashRows dq_acc;  // fp32 target of the atomic dQ adds
};

// One warp per (query row, head): Delta = sum_d dO * O, any float dtypes.
template <typename Call>
__global__ void delta_kernel(Call c, FlashStats delta) {
  const int64_t warp_id = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp_id >= c.s.total_q * c.s.heads_q) return;
  const int h = static_cast<int>(warp_id % c.s.heads_q);
  const int64_t r = warp_id / c.s.heads_q;
  const int b = c.s.cu_q ? 0 : static_cast<int>(r / c.s.seqlen_q);
  const int64_t i = c.s.cu_q ? r : r % c.s.seqlen_q;
  const int64_t ooff = row_off(c.o, b, i, h), doff = row_off(c.dout, b, i, h);
  float acc = 0.f;
  for (int d = lane; d < c.s.head_dim; d += 32)
    acc = fmaf(eff::load_elem(c.o.ptr, c.o.elem, ooff + d), eff::load_elem(c.dout.ptr, c.dout.elem, doff + d), acc);
#pragma unroll
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) delta.ptr[stat_off(delta, b, i, h)] = acc;
}

template <int D, int kWarps, int BM, bool kAtomicDq>
struct DkdvConfig {
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int BN = 16 * kWarps;
  static constexpr int kTileQ = BM * D * 2;  // bytes of one Q or dO tile
  static constexpr int kSmemBytes = 2 * BN * D * 2 + 4 * kTileQ + 4 * BM * 4 + (kAtomicDq ? BN * BM * 2 : 0);
  // dQ = dS K split over the warps: WM along the query rows, the rest along D.
  static constexpr int WM = BM / 16, WD = kWarps / WM, DW = D / WD;
  static_assert(kWarps % WM == 0 && DW % 16 == 0, "dQ warp split");
};

// D: the tile width (the head dim, or what V pads it to).
template <typename V, typename T, int D, int kWarps, int BM, bool kAtomicDq>
__global__ void __launch_bounds__(32 * kWarps, 1) flash_bwd_dkdv_kernel(BwdKernelArgs<typename V::BwdCall> args) {
  using Cfg = DkdvConfig<D, kWarps, BM, kAtomicDq>;
  constexpr int BN = Cfg::BN, kThreads = Cfg::kThreads;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sK = smem_u32(smem), sV = sK + BN * D * 2, sQ0 = sV + BN * D * 2;
  const uint32_t sDO0 = sQ0 + 2 * Cfg::kTileQ, sStat = sDO0 + 2 * Cfg::kTileQ;
  const uint32_t sDS = sStat + 4 * BM * 4;
  // sStat holds, per buffer, BM LSE values then BM Delta values.
  const float* stat = reinterpret_cast<const float*>(smem + (sStat - sK));

  const auto& c = args.c;
  const FlashShape& s = c.s;
  const int group = s.heads_q / s.heads_kv;
  const int b = blockIdx.z, hk = blockIdx.y, n0 = blockIdx.x * BN;
  const Seq seq = seq_of(s, b);
  if (n0 >= seq.skv) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const bool causal = s.mask != kMaskNone;
  const int chunks = V::kPadHeadDim ? s.head_dim / 8 : D / 8;  // 16-byte chunks of a row that hold data
  const float inv_scale = 1.f / s.scale;  // the bias in raw-score units

  const TileRange tiles = query_tiles(s, seq, n0, n0 + BN, BM);
  const int mb_first = tiles.first, mb_count = max(0, tiles.end - tiles.first);
  const int steps = group * mb_count;

  auto prefetch = [&](int step, int buf) {
    const int h = hk * group + step / mb_count, m0 = (mb_first + step % mb_count) * BM;
    const int rows = seq.sq - m0;
    load_tile<BM, D, kThreads>(sQ0 + buf * Cfg::kTileQ,
                               static_cast<const uint16_t*>(c.q.ptr) + row_off(c.q, b, seq.q_row0 + m0, h),
                               c.q.row_stride, rows, chunks);
    load_tile<BM, D, kThreads>(sDO0 + buf * Cfg::kTileQ,
                               static_cast<const uint16_t*>(c.dout.ptr) + row_off(c.dout, b, seq.q_row0 + m0, h),
                               c.dout.row_stride, rows, chunks);
    for (int r = threadIdx.x; r < 2 * BM; r += kThreads) {
      const int i = r % BM;
      const FlashStats& src = r < BM ? c.lse : args.delta;
      const bool ok = i < rows;
      cp_async4(sStat + (buf * 2 * BM + r) * 4, ok ? src.ptr + stat_off(src, b, seq.q_row0 + m0 + i, h) : src.ptr, ok);
    }
  };

  const int keys = seq.skv - n0;
  load_tile<BN, D, kThreads>(sK, static_cast<const uint16_t*>(c.k.ptr) + row_off(c.k, b, seq.kv_row0 + n0, hk),
                             c.k.row_stride, keys, chunks);
  load_tile<BN, D, kThreads>(sV, static_cast<const uint16_t*>(c.v.ptr) + row_off(c.v, b, seq.kv_row0 + n0, hk),
                             c.v.row_stride, keys, chunks);
  if (steps > 0) prefetch(0, 0);
  cp_async_commit();

  const float scale_log2 = s.scale * kLog2e;
  float dk[D / 8][4] = {}, dv[D / 8][4] = {};

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
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[4];
      ldsm_x4(a_addr<D>(sK, warp * 16, kk * 16, lane), a);
#pragma unroll
      for (int np = 0; np < BM / 16; ++np) {
        uint32_t bq[4];
        ldsm_x4(bt_addr<D>(sQ, np * 16, kk * 16, lane), bq);
        mma<T>(p[2 * np], a, bq[0], bq[1]);
        mma<T>(p[2 * np + 1], a, bq[2], bq[3]);
      }
    }
    // The tile's last row has the latest window start: a key tile beginning before it needs the window mask.
    const bool need_mask = m0 + BM > seq.sq || n0 + BN > seq.skv || (causal && n0 + BN > m0 + 1 + seq.shift) ||
                           n0 < key_start(s, seq, min(m0 + BM, seq.sq) - 1);
#pragma unroll
    for (int nt = 0; nt < BM / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = nt * 8 + 2 * t + (e & 1);
        const int key = n0 + warp * 16 + g + 8 * (e >> 1), row = m0 + col;
        const bool visible =
            !need_mask || (row < seq.sq && key < key_limit(s, seq, row) && key >= key_start(s, seq, row));
        if constexpr (V::kBias)
          if (c.bias.ptr && row < seq.sq && key < seq.skv) p[nt][e] += bias_score(c.bias, b, h, row, key, inv_scale);
        p[nt][e] = visible ? exp2f(p[nt][e] * scale_log2 - lse_log2(sLse[col])) : 0.f;
      }
    }

    // dV += P^T dO
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) {
      uint32_t a[4];
      c_to_a<T>(p[2 * kk], p[2 * kk + 1], a);
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t bo[4];
        ldsm_x4_trans(b_addr_trans<D>(sDO, kk * 16, dp * 16, lane), bo);
        mma<T>(dv[2 * dp], a, bo[0], bo[1]);
        mma<T>(dv[2 * dp + 1], a, bo[2], bo[3]);
      }
    }

    // dP^T = V dO^T, then dS^T = P^T (dP^T - Delta) * scale, in place.
    float ds[BM / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[4];
      ldsm_x4(a_addr<D>(sV, warp * 16, kk * 16, lane), a);
#pragma unroll
      for (int np = 0; np < BM / 16; ++np) {
        uint32_t bo[4];
        ldsm_x4(bt_addr<D>(sDO, np * 16, kk * 16, lane), bo);
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
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t bq[4];
        ldsm_x4_trans(b_addr_trans<D>(sQ, kk * 16, dp * 16, lane), bq);
        mma<T>(dk[2 * dp], a, bq[0], bq[1]);
        mma<T>(dk[2 * dp + 1], a, bq[2], bq[3]);
      }
    }

    if constexpr (kAtomicDq) {
      // dS^T to shared memory ([key][query]), then dQ[BM x D] += dS K, added to the fp32 buffer.
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
          ldsm_x4_trans(b_addr_trans<D>(sK, kk * 16, d0 + dp * 16, lane), bk);
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
          if constexpr (V::kPadHeadDim)
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
    for (int dt = 0; dt < D / 8; ++dt) {
      if (dt >= chunks) continue;
      store_pair<T>(c.dk.ptr, c.dk.elem, koff + dt * 8, dk[dt][2 * half], dk[dt][2 * half + 1], c.accumulate);
      store_pair<T>(c.dv.ptr, c.dv.elem, voff + dt * 8, dv[dt][2 * half], dv[dt][2 * half + 1], c.accumulate);
    }
  }
}

template <int D, int kWarps, int BN>
struct DqConfig {
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int BM = 16 * kWarps;
  static constexpr int kSmemBytes = 2 * BM * D * 2 + 4 * BN * D * 2;
};

// Deterministic dQ: one CTA per (query tile, head, sequence), each warp 16 rows, K/V tiles double-buffered.
template <typename V, typename T, int D, int kWarps, int BN>
__global__ void __launch_bounds__(32 * kWarps, 1) flash_bwd_dq_kernel(BwdKernelArgs<typename V::BwdCall> args) {
  using Cfg = DqConfig<D, kWarps, BN>;
  constexpr int BM = Cfg::BM, kThreads = Cfg::kThreads, kTileKV = BN * D * 2;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sQ = smem_u32(smem), sDO = sQ + BM * D * 2, sKV0 = sDO + BM * D * 2;

  const auto& c = args.c;
  const FlashShape& s = c.s;
  const int b = blockIdx.z, h = blockIdx.y, hk = h / (s.heads_q / s.heads_kv);
  const int m0 = (gridDim.x - 1 - blockIdx.x) * BM;
  const Seq seq = seq_of(s, b);
  if (m0 >= seq.sq) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int rows_valid = min(BM, seq.sq - m0);
  // Key tiles any row of the tile may see: [nb_first, n_tiles) (limits and window starts grow with the row).
  const int n_tiles = (key_limit(s, seq, m0 + rows_valid - 1) + BN - 1) / BN, nb_first = key_start(s, seq, m0) / BN;
  const int n_win = key_start(s, seq, m0 + rows_valid - 1);  // key tiles beginning before it need the window mask
  const int chunks = V::kPadHeadDim ? s.head_dim / 8 : D / 8;  // 16-byte chunks of a row that hold data
  const float inv_scale = 1.f / s.scale;  // the bias in raw-score units

  const uint16_t* gk = static_cast<const uint16_t*>(c.k.ptr) + row_off(c.k, b, seq.kv_row0, hk);
  const uint16_t* gv = static_cast<const uint16_t*>(c.v.ptr) + row_off(c.v, b, seq.kv_row0, hk);
  auto prefetch = [&](int nb, int buf) {
    const int64_t n0 = int64_t(nb) * BN;
    load_tile<BN, D, kThreads>(sKV0 + (2 * buf) * kTileKV, gk + n0 * c.k.row_stride, c.k.row_stride, seq.skv - nb * BN,
                               chunks);
    load_tile<BN, D, kThreads>(sKV0 + (2 * buf + 1) * kTileKV, gv + n0 * c.v.row_stride, c.v.row_stride,
                               seq.skv - nb * BN, chunks);
  };
  if (n_tiles > nb_first) {
    load_tile<BM, D, kThreads>(sQ, static_cast<const uint16_t*>(c.q.ptr) + row_off(c.q, b, seq.q_row0 + m0, h),
                               c.q.row_stride, rows_valid, chunks);
    load_tile<BM, D, kThreads>(sDO, static_cast<const uint16_t*>(c.dout.ptr) + row_off(c.dout, b, seq.q_row0 + m0, h),
                               c.dout.row_stride, rows_valid, chunks);
    prefetch(nb_first, 0);
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
  float dq[D / 8][4] = {};

  for (int nb = nb_first; nb < n_tiles; ++nb) {
    const int n0 = nb * BN, buf = (nb - nb_first) & 1;
    const uint32_t sK = sKV0 + (2 * buf) * kTileKV, sV = sK + kTileKV;
    cp_async_wait_all();
    __syncthreads();
    if (nb + 1 < n_tiles) {
      prefetch(nb + 1, buf ^ 1);
      cp_async_commit();
    }
    float p[BN / 8][4] = {}, ds[BN / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t aq[4], ao[4];
      ldsm_x4(a_addr<D>(sQ, warp * 16, kk * 16, lane), aq);
      ldsm_x4(a_addr<D>(sDO, warp * 16, kk * 16, lane), ao);
#pragma unroll
      for (int np = 0; np < BN / 16; ++np) {
        uint32_t bk[4], bv[4];
        ldsm_x4(bt_addr<D>(sK, np * 16, kk * 16, lane), bk);
        ldsm_x4(bt_addr<D>(sV, np * 16, kk * 16, lane), bv);
        mma<T>(p[2 * np], aq, bk[0], bk[1]);
        mma<T>(p[2 * np + 1], aq, bk[2], bk[3]);
        mma<T>(ds[2 * np], ao, bv[0], bv[1]);
        mma<T>(ds[2 * np + 1], ao, bv[2], bv[3]);
      }
    }
    const bool need_mask = m0 + BM > seq.sq || n0 + BN > seq.skv ||
                           (s.mask != kMaskNone && n0 + BN > m0 + 1 + seq.shift) || n0 < n_win;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = m0 + warp * 16 + g + 8 * half;
      const int lim = row < seq.sq ? key_limit(s, seq, row) : 0, first = row < seq.sq ? key_start(s, seq, row) : 0;
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = n0 + nt * 8 + 2 * t + e;
          float& x = p[nt][2 * half + e];
          if constexpr (V::kBias)
            if (c.bias.ptr && row < seq.sq && key < seq.skv) x += bias_score(c.bias, b, h, row, key, inv_scale);
          const float pv = (!need_mask || (key < lim && key >= first)) ? exp2f(x * scale_log2 - row_lse2[half]) : 0.f;
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
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t bk[4];
        ldsm_x4_trans(b_addr_trans<D>(sK, kk * 16, dp * 16, lane), bk);
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
    for (int dt = 0; dt < D / 8; ++dt)
      if (dt < chunks)
        store_pair<T>(c.dq.ptr, c.dq.elem, off + dt * 8, dq[dt][2 * half], dq[dt][2 * half + 1], c.accumulate);
  }
}

// dq = the fp32 atomic buffer (contiguous [rows, Hq, D]), in dq's dtype and strides.
template <typename T, typename Call>
__global__ void flash_bwd_dq_convert_kernel(BwdKernelArgs<Call> args) {
  const Call& c = args.c;
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

template <typename Kernel, typename... Args>
void launch(Kernel kernel, const char* name, dim3 grid, int threads, int smem, cudaStream_t stream,
            const FlashShape& s, const Args&... args) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;  // e.g. no keys: nothing to compute, nothing to store
  if (smem > 48 * 1024)
    RT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
                  cat(name, ": setting ", smem, " bytes of shared memory"));
  kernel<<<grid, threads, smem, stream>>>(args...);
  RT_CUDA_CHECK(cudaGetLastError(),
                cat("launching ", name, " grid (", grid.x, ", ", grid.y, ", ", grid.z, ")", flash_shape_str(s)));
}

template <typename Call>
void compute_delta(const Call& c, const FlashStats& delta, cudaStream_t stream) {
  const int64_t warps = c.s.total_q * c.s.heads_q;
  launch(delta_kernel<Call>, "delta_kernel", dim3(static_cast<unsigned>((warps + 7) / 8)), 256, 0, stream, c.s, c,
         delta);
}

// flash_bwd_dkdv_kernel's launch shape: 8 warps (128 keys) per CTA, query tiles of 64 rows.
constexpr int kDkdvWarps = 8, kDkdvBM = 64;
dim3 dkdv_grid(const FlashShape& s) {
  return dim3((s.seqlen_kv + 16 * kDkdvWarps - 1) / (16 * kDkdvWarps), s.heads_kv, s.batch);
}

// Fast mode of the mma.sync kernels: dQ is added with atomics into dq itself (accumulate, fp32) or into a zeroed
// fp32 buffer.
template <typename V, typename T, int D>
void launch_bwd_atomic_dq(const typename V::BwdCall& c, BwdKernelArgs<typename V::BwdCall> args,
                          cudaStream_t stream) {
  const FlashShape& s = c.s;
  const int64_t rows = s.total_q;
  const bool direct = c.accumulate;
  const size_t acc_bytes = direct ? 0 : static_cast<size_t>(rows * s.heads_q * s.head_dim) * 4;
  StreamScratch acc_buf(acc_bytes, stream, cat(V::kBackend, " backward dQ accumulator").c_str());
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
                    cat("zeroing the ", V::kBackend, " dQ accumulator", flash_shape_str(s)));
  }
  using Cfg = DkdvConfig<D, kDkdvWarps, kDkdvBM, true>;
  launch(flash_bwd_dkdv_kernel<V, T, D, kDkdvWarps, kDkdvBM, true>, "flash_bwd_dkdv_kernel", dkdv_grid(s),
         Cfg::kThreads, Cfg::kSmemBytes, stream, s, args);
  if (!direct) {
    const int64_t pairs = rows * s.heads_q * s.head_dim / 2;
    launch(flash_bwd_dq_convert_kernel<T, typename V::BwdCall>, "flash_bwd_dq_convert_kernel",
           dim3(static_cast<unsigned>((pairs + 255) / 256)), 256, 0, stream, s, args);
  }
}

template <typename V, typename T, int D>
void launch_bwd(const typename V::BwdCall& c, cudaStream_t stream) {
  const FlashShape& s = c.s;
  BwdKernelArgs<typename V::BwdCall> args{c, {}, {}};
  const int64_t rows = s.total_q;
  StreamScratch delta_buf(static_cast<size_t>(rows * s.heads_q) * 4, stream,
                          cat(V::kBackend, " backward Delta").c_str());
  args.delta.ptr = reinterpret_cast<float*>(delta_buf.bytes());
  args.delta.row_stride = 1;
  args.delta.head_stride = s.cu_q ? rows : s.seqlen_q;
  args.delta.batch_stride = s.cu_q ? 0 : int64_t(s.heads_q) * s.seqlen_q;
  compute_delta(c, args.delta, stream);

  if (c.deterministic) {
    RT_CHECK(s.head_dim <= D, V::kBackend, ": no deterministic backward for head dim ", s.head_dim,
             flash_shape_str(s));
    using Cfg = DkdvConfig<D, kDkdvWarps, kDkdvBM, false>;
    launch(flash_bwd_dkdv_kernel<V, T, D, kDkdvWarps, kDkdvBM, false>, "flash_bwd_dkdv_kernel", dkdv_grid(s),
           Cfg::kThreads, Cfg::kSmemBytes, stream, s, args);
    using QCfg = DqConfig<D, 4, 64>;
    const dim3 q_grid((s.seqlen_q + QCfg::BM - 1) / QCfg::BM, s.heads_q, s.batch);
    launch(flash_bwd_dq_kernel<V, T, D, 4, 64>, "flash_bwd_dq_kernel", q_grid, QCfg::kThreads, QCfg::kSmemBytes,
           stream, s, args);
    return;
  }
  if constexpr (std::is_same_v<V, FlashVariant>) {
    flash_backward_sm90(c, args.delta, stream);
  } else {
    launch_bwd_atomic_dq<V, T, D>(c, args, stream);
  }
}

template <typename V>
void backward(const typename V::BwdCall& c, cudaStream_t stream) {
  if (c.s.total_q == 0 && c.s.seqlen_kv == 0) return;
  // The mma.sync kernels' tile width: the head dim for flash (64 or 128), the padded one for efficient (<= 128).
  // Flash at head dim 256 runs the Hopper kernel only (no deterministic mode there).
  const bool d64 = c.s.head_dim <= 64;
  if (c.s.bf16) d64 ? launch_bwd<V, __nv_bfloat16, 64>(c, stream) : launch_bwd<V, __nv_bfloat16, 128>(c, stream);
  else d64 ? launch_bwd<V, __half, 64>(c, stream) : launch_bwd<V, __half, 128>(c, stream);
}

}  // namespace

void flash_backward(const FlashBwdCall& c, cudaStream_t stream) { backward<FlashVariant>(c, stream); }

// One instantiation with and without a bias: a separate no-bias backward spilled more (flash_tile.cuh).
void efficient_backward_tc(const EffBwdCall& c, cudaStream_t stream) { backward<EfficientVariant<true>>(c, stream); }

void efficient_delta(const EffBwdCall& c, const FlashStats& delta, cudaStream_t stream) {
  compute_delta(c, delta, stream);
}

}  // namespace ringtrain::attention::cuda
