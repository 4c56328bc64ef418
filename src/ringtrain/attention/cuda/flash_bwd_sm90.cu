// The `flash` backward on Hopper (fast mode), warp-specialised in the FlashAttention-3 structure. One CTA per (key
// tile of 128 keys, 64 above D = 128, kv head, sequence) of three warpgroups:
//  - the producer (one warp of warpgroup 0, its registers given back) copies K and V once, then for every query tile
//    (128 rows at D = 64, 64 above) of every query head of the GQA group that can see the keys (causally and within
//    a sliding window) its Q, dO, LSE and Delta into a ring of shared-memory stages (three at D = 64 and 192, two at
//    128 and 256) guarded by full and empty mbarriers (tma.cuh):
//    bulk-tensor (TMA) copies, or zero-filling cp.async for tiles that reach past their sequence's end (a NaN there
//    would survive the zeroed P^T and dS^T in 0 * NaN); LSE and Delta always by cp.async, zero-filled;
//  - two consumers own 64 keys each and keep their dK and dV in registers. Per query tile each computes
//      S^T = K Q^T and dP^T = V dO^T (shared operands), P^T and dS^T = P^T (dP^T - Delta) * scale in registers,
//      dV += P^T dO and dK += dS^T Q (P^T and dS^T as register operands),
//    and blocks of dQ = dS K over all 128 keys from dS^T in shared memory (double-buffered, so that only a block's
//    readers wait for its writers). At head dim 128 a query tile has 64 rows and the consumers split dQ's columns;
//    at head dim 64 it has 128 rows (FlashAttention-3's tile there) and each consumer takes the 64 x 64 block of its
//    own 64 rows. Either way every dQ element is reduced once per key tile (split by keys, two reductions would add
//    into the same block and double the atomic traffic into L2).
// Each block is added to an fp32 accumulator in global memory, straight from the registers by vector reductions, in
// the order the registers hold it; flash_dq_convert_sm90_kernel reads that order back into dq. The accumulator
// holds, per query head, one 64 x D block per 64 query rows (dq_tile_base).
// At D = 192 and 256 a CTA has 64 keys, which both consumers share, splitting the work by gradient: one computes P^T
// and keeps dV, the other dP^T and dS^T and keeps dK (consume_bwd_split), each adding part of dQ from registers.
#include <cuda.h>

#include "ringtrain/attention/cuda/cuda_util.h"
#include "ringtrain/attention/cuda/flash_sm90.h"
#include "ringtrain/attention/cuda/flash_sm90_schedule.cuh"
#include "ringtrain/attention/cuda/flash_tile.cuh"
#include "ringtrain/attention/cuda/tma.cuh"
#include "ringtrain/attention/cuda/tma_map.h"
#include "ringtrain/attention/cuda/wgmma.cuh"

namespace ringtrain::attention::cuda {
namespace {

using namespace tile;

template <int D>
struct BwdSm90Config {
  // Above D = 128 a 64-key tile's dK and dV take D / 2 fp32 registers per thread each: the two consumers share the
  // tile's keys, one keeping dV and the other dK (consume_bwd_split). Below, each consumer owns 64 keys and both
  // gradients.
  static constexpr bool kSplitByGradient = D > 128;
  // At D = 64 a step takes 128 query rows, as FlashAttention-3 does there: its GEMMs are small, and twice the rows
  // per step halve the barriers and waits per unit of work.
  static constexpr int kConsumers = 2, kThreads = 128 * (1 + kConsumers), BM = D == 64 ? 128 : 64,
                       BN = kSplitByGradient ? 64 : 128;
  // As many as fit, but two at D = 128: a third fits there and is no faster (level to 1 % slower, PERF.md).
  static constexpr int kStages = D == 64 || D == 192 ? 3 : 2;
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;  // 128 x 24 + 256 x 240 <= 65536
  // Where dV += P^T dO goes, the consumer being at its register limit either way. With 128 rows it is issued after
  // dS^T is made, P^T and dS^T packed together so that the fp32 scores die first (issued before, the consumer spills
  // and fwd+bwd is 14 % slower, PERF.md); with 64 rows it is waited for before dS^T is made, so that P^T's fragments
  // are free (backward 1-3 % faster).
  static constexpr bool kDvAfterDs = BM == 128;
  // Each step's dQ block is 64 x D per 64 query rows, every element reduced once per key tile. With 128 rows each
  // consumer computes its own 64 rows' block over all the tile's keys; with 64 rows (D = 128) each computes 64 of
  // the columns (one consumer holding the whole block spills there and is 1-3 % slower, PERF.md).
  static constexpr bool kDqByRows = BM == 128;
  static constexpr int kDqCols = kDqByRows ? D : 64;
  static constexpr int kTileKV = BN * D * 2, kTileQ = BM * D * 2;
  static constexpr int kDsBytes = BN * BM * 2;  // dS^T, [BN keys][BM queries]
  // dS^T is double-buffered where each consumer writes its own keys' rows; the split consumers' single buffer is
  // ordered by their hand-over barriers (consume_bwd_split).
  static constexpr int kDsBuffers = kSplitByGradient ? 1 : 2;
  static constexpr int kPtBytes = kSplitByGradient ? BN * BM * 4 : 0;  // P^T handed between split consumers, fp32
  static constexpr int kStatBytes = 2 * BM * 4;  // per stage: BM LSE values, then BM Delta values
  static constexpr int kBarriers = 1 + 2 * kStages;  // K/V; full and empty per stage
  static constexpr int kSmemBytes = 1024 + 2 * kTileKV + 2 * kStages * kTileQ + kDsBuffers * kDsBytes + kPtBytes +
                                    kStages * kStatBytes + 8 * kBarriers;
  static_assert(kSmemBytes <= 227 * 1024, "the backward's tiles must fit in the SM's shared memory");
};

struct BwdMaps {
  CUtensorMap q, dout, k, v;
};

struct BwdSm90Args {
  FlashBwdCall c;
  FlashStats delta;      // rowsum(dO * O), LSE-shaped
  float* dq_acc;         // [Hq][tiles_per_head][64 x D], zeroed
  int64_t tiles_per_head;
};

// First dQ accumulator tile of sequence b: packed sequences start at cu_q[b] / 64 + b, which leaves each one at
// least its ceil(length / 64) tiles before the next.
__device__ __forceinline__ int64_t dq_tile_base(const FlashShape& s, int b) {
  return s.cu_q ? int64_t(s.cu_q[b]) / 64 + b : int64_t(b) * ((s.seqlen_q + 63) / 64);
}

// The accumulator's tile `tile` (dq_tile_base + query row / 64) of head h, from column col0 (a multiple of 64).
template <int D>
__device__ __forceinline__ float* dq_tile(const BwdSm90Args& a, int h, int64_t tile, int col0) {
  return a.dq_acc + (h * a.tiles_per_head + tile) * 64 * D + col0 * 64;
}

// Position (in floats) of dQ element (r, c) of a 64 x D tile in the accumulator's order: block c / 64 (64 x 64),
// then warp r / 16, column group, lane, row half, pair element: the order the kernel's registers hold a block in (a
// thread's four values of a column group side by side, one 16-byte reduction).
__device__ __forceinline__ int dq_acc_index(int r, int c) {
  const int cc = c % 64, lane = 4 * (r % 8) + (cc % 8) / 2;
  return (c / 64) * 64 * 64 + 4 * (((r / 16) * 8 + cc / 8) * 32 + lane) + 2 * ((r % 16) / 8) + cc % 2;
}

// Shared memory of one CTA: K, V, the Q / dO / statistics ring, dS^T, P^T (split consumers), barriers.
template <int D>
struct BwdSmem {
  using Cfg = BwdSm90Config<D>;
  uint32_t k, v, q0, do0, ds0, pt, stat0, bars;
  const float* stats;  // stat0 as a generic pointer, for plain loads
  __device__ explicit BwdSmem(unsigned char* base) {
    k = (smem_u32(base) + 1023) & ~1023u;
    v = k + Cfg::kTileKV;
    q0 = v + Cfg::kTileKV;
    do0 = q0 + Cfg::kStages * Cfg::kTileQ;
    ds0 = do0 + Cfg::kStages * Cfg::kTileQ;
    pt = ds0 + Cfg::kDsBuffers * Cfg::kDsBytes;
    stat0 = pt + Cfg::kPtBytes;
    bars = stat0 + Cfg::kStages * Cfg::kStatBytes;
    stats = reinterpret_cast<const float*>(base + (stat0 - smem_u32(base)));
  }
  __device__ uint32_t q(int stage) const { return q0 + stage * Cfg::kTileQ; }
  __device__ uint32_t dout(int stage) const { return do0 + stage * Cfg::kTileQ; }
  __device__ uint32_t ds(int step) const { return ds0 + (step % Cfg::kDsBuffers) * Cfg::kDsBytes; }
  __device__ uint32_t stat(int stage) const { return stat0 + stage * Cfg::kStatBytes; }
  __device__ uint32_t full_kv() const { return bars; }
  __device__ uint32_t full(int stage) const { return bars + 8 * (1 + stage); }
  __device__ uint32_t empty(int stage) const { return bars + 8 * (1 + Cfg::kStages + stage); }
};

// What a CTA works on: its keys and the query tiles that see them, walked head by head of the GQA group.
struct BwdTile {
  int b, hk, n0, group;
  Seq seq;
  int mb_first, mb_count, steps;
  __device__ int head(int step) const { return hk * group + step / mb_count; }
  __device__ int row0(int step, int bm) const { return (mb_first + step % mb_count) * bm; }
};

// Producer: K and V once, then per step Q, dO, LSE and Delta of query tile row0(step) of head(step).
template <int D>
__device__ __forceinline__ void produce_bwd(const BwdMaps& maps, const BwdSm90Args& a, const BwdSmem<D>& sm,
                                            const BwdTile& w, int lane) {
  using Cfg = BwdSm90Config<D>;
  constexpr int BM = Cfg::BM, BN = Cfg::BN;
  const FlashBwdCall& c = a.c;
  const int batch_coord = c.s.cu_q ? 0 : w.b;  // packed tensors are one batch entry of all rows
  // A tile by TMA (its bytes announced to `full`) or, when it reaches past the sequence end, by zero-filling cp.async.
  auto copy_tile = [&](uint32_t dst, const CUtensorMap* map, const FlashRows& t, int64_t row, int head, int rows,
                       int rows_valid, uint32_t full) {
    if (rows_valid >= rows) {
      if (lane == 0) {
        tma::expect_bytes(full, rows * D * 2);
        for (int p = 0; p < D / 64; ++p)
          tma::load_4d(dst + p * rows * 128, map, full, p * 64, int(row), head, batch_coord);
      }
    } else {
      const uint16_t* g = static_cast<const uint16_t*>(t.ptr) + row_off(t, w.b, row, head);
      if (rows == BN) wg::load_panels_by_warp<BN, D>(dst, g, t.row_stride, rows_valid, lane);
      else wg::load_panels_by_warp<BM, D>(dst, g, t.row_stride, rows_valid, lane);
    }
  };
  // A `full` barrier (one arrival) completes once the announced TMA bytes and every lane's cp.async have landed: the
  // lanes' copy-tracking arrivals are counted in before lane 0's arrival.
  auto arrive_full = [&](uint32_t full) {
    tma::arrive_when_copied(full);
    __syncwarp();
    if (lane == 0) tma::arrive(full);
  };
  const int64_t kv_row = w.seq.kv_row0 + w.n0;
  copy_tile(sm.k, &maps.k, c.k, kv_row, w.hk, BN, w.seq.skv - w.n0, sm.full_kv());
  copy_tile(sm.v, &maps.v, c.v, kv_row, w.hk, BN, w.seq.skv - w.n0, sm.full_kv());
  arrive_full(sm.full_kv());

  for (int step = 0; step < w.steps; ++step) {
    const int stage = step % Cfg::kStages;
    tma::wait(sm.empty(stage), ((step / Cfg::kStages) & 1) ^ 1);
    const int h = w.head(step), m0 = w.row0(step, BM), rows = w.seq.sq - m0;
    const int64_t q_row = w.seq.q_row0 + m0;
    // LSE and Delta, zero-filled past the sequence: 2 x BM values.
    for (int i = lane; i < 2 * BM; i += 32) {
      const FlashStats& src = i < BM ? c.lse : a.delta;
      const bool ok = i % BM < rows;
      cp_async4(sm.stat(stage) + i * 4, ok ? src.ptr + stat_off(src, w.b, q_row + i % BM, h) : src.ptr, ok);
    }
    copy_tile(sm.q(stage), &maps.q, c.q, q_row, h, BM, rows, sm.full(stage));
    copy_tile(sm.dout(stage), &maps.dout, c.dout, q_row, h, BM, rows, sm.full(stage));
    arrive_full(sm.full(stage));
  }
}

// P^T = exp(S^T scale - LSE) in place, for this thread's keys key0 and key0 + 8 (rows of S^T) and the tile's query
// rows m0 + column; zero where a query row is past the sequence or cannot see the key (checked only in tiles that
// have such rows).
template <int BM, int BN>
__device__ __forceinline__ void probabilities_t(float (&sp)[BM / 2], const float* s_lse, const FlashShape& s,
                                                const Seq& seq, int m0, int n0, int key0, int t, float scale_log2) {
#pragma unroll
  for (int j = 0; j < BM / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float lse2 = lse_log2(s_lse[8 * j + 2 * t + e]);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float& x = sp[4 * j + 2 * half + e];
        x = exp2_approx(x * scale_log2 - lse2);
      }
    }
  }
  // The tile's last row has the latest window start: a key tile beginning before it needs the window mask too.
  if (m0 + BM > seq.sq || n0 + BN > seq.skv || (s.mask != kMaskNone && n0 + BN > m0 + 1 + seq.shift) ||
      n0 < key_start(s, seq, min(m0 + BM, seq.sq) - 1)) {
#pragma unroll
    for (int j = 0; j < BM / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int row = m0 + 8 * j + 2 * t + e;
        const int lim = row < seq.sq ? key_limit(s, seq, row) : 0, first = row < seq.sq ? key_start(s, seq, row) : 0;
#pragma unroll
        for (int half = 0; half < 2; ++half)
          if (key0 + 8 * half >= lim || key0 + 8 * half < first) sp[4 * j + 2 * half + e] = 0.f;
      }
    }
  }
}

// dS^T = P^T (dP^T - Delta) * scale, in place of dP^T.
template <int BM>
__device__ __forceinline__ void score_grads_t(float (&dp)[BM / 2], const float (&pt)[BM / 2], const float* s_delta,
                                              float scale, int t) {
#pragma unroll
  for (int j = 0; j < BM / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float delta = s_delta[8 * j + 2 * t + e];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = 4 * j + 2 * half + e;
        dp[i] = pt[i] * (dp[i] - delta) * scale;
      }
    }
  }
}

// P^T and dS^T = P^T (dP^T - Delta) * scale as register-A fragments, fragment by fragment, so that each fp32 value
// dies as its pair is packed: the fp32 scores and score gradients are never all live beside both fragment sets.
template <typename T, int BM>
__device__ __forceinline__ void to_a_with_score_grads(const float (&sp)[BM / 2], const float (&dp)[BM / 2],
                                                      const float* s_delta, float scale, int t,
                                                      uint32_t (&pt)[BM / 16][4], uint32_t (&dst)[BM / 16][4]) {
#pragma unroll
  for (int k = 0; k < BM / 16; ++k)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int i = 8 * k + 2 * r;  // values i and i + 1: query columns 8 (i / 4) + 2t + {0, 1}
      const float d0 = s_delta[8 * (i / 4) + 2 * t], d1 = s_delta[8 * (i / 4) + 2 * t + 1];
      pt[k][r] = tile::pack2<T>(sp[i], sp[i + 1]);
      dst[k][r] = tile::pack2<T>(sp[i] * (dp[i] - d0) * scale, sp[i + 1] * (dp[i + 1] - d1) * scale);
    }
}

// This thread's rows (key, key + 8) of dS^T, held as register-A fragments, into the [BN keys][BM queries] panel tile
// at sDS (1024-byte aligned, so a row's swizzle bits are free to XOR). Each store address is one XOR and an
// immediate from its row's base; the base comes out of an opaque add so that the compiler cannot precompute all
// BM / 4 addresses once and keep them live across the step loop, where they would spill the consumer's registers.
template <int BM, int BN>
__device__ __forceinline__ void store_ds_t(uint32_t sDS, const uint32_t (&dst)[BM / 16][4], int key, int t) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const uint32_t in_tile = static_cast<uint32_t>((key + 8 * half) * 128 + ((key & 7) << 4) + 4 * t);
    uint32_t row;
    asm volatile("add.u32 %0, %1, %2;\n" : "=r"(row) : "r"(sDS), "r"(in_tile));
#pragma unroll
    for (int j = 0; j < BM / 8; ++j)
      asm volatile("st.shared.u32 [%0], %1;\n" ::"r"((row ^ ((j % 8) << 4)) + (j / 8) * BN * 128),
                   "r"(j % 2 == 0 ? dst[j / 2][half] : dst[j / 2][2 + half]));
  }
}

// A 64 x N block of dQ (an m64nN accumulator) added to the accumulator's 64-column blocks from `acc` on, in
// register order (dq_acc_index), by one 16-byte reduction per column group (consecutive lanes, consecutive 16
// bytes: 512 contiguous bytes per warp instruction).
template <int N>
__device__ __forceinline__ void reduce_dq(float* acc, const float (&dq)[N / 2], int warp, int lane) {
#pragma unroll
  for (int j = 0; j < N / 8; ++j) {
    const uint32_t slot = (warp * 8 + j % 8) * 32 + lane;
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(acc + (j / 8) * 64 * 64 + 4 * slot),
                 "f"(dq[4 * j]), "f"(dq[4 * j + 1]), "f"(dq[4 * j + 2]), "f"(dq[4 * j + 3])
                 : "memory");
  }
}

// A key gradient (dK or dV: an m64nD accumulator whose rows are this thread's keys key0 and key0 + 8) into its tensor.
template <typename T, int D>
__device__ __forceinline__ void store_key_grad(const FlashRows& dst, const float (&x)[D / 2], const BwdTile& w,
                                               int key0, int t, bool accumulate) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int key = key0 + 8 * half;
    if (key >= w.seq.skv) continue;
    const int64_t off = row_off(dst, w.b, w.seq.kv_row0 + key, w.hk) + 2 * t;
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
      store_pair<T>(dst.ptr, dst.elem, off + 8 * j, x[4 * j + 2 * half], x[4 * j + 2 * half + 1], accumulate);
  }
}

template <typename T, int D>
__device__ __forceinline__ void consume_bwd(const BwdSm90Args& a, const BwdSmem<D>& sm, const BwdTile& w, int wgi,
                                            int ctid) {
  using Cfg = BwdSm90Config<D>;
  constexpr int BM = Cfg::BM, BN = Cfg::BN;
  const FlashBwdCall& c = a.c;
  const FlashShape& s = c.s;
  const Seq& seq = w.seq;
  const int n0 = w.n0, warp = ctid % 128 / 32, lane = ctid % 32, g = lane / 4, t = lane % 4;
  const int key0 = n0 + wgi * 64 + warp * 16 + g;  // this thread's keys: key0, key0 + 8
  const int64_t tile_base = dq_tile_base(s, w.b);

  const float scale_log2 = s.scale * kLog2e;
  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;

  if (w.steps > 0) {
    tma::wait(sm.full_kv(), 0);
    if (n0 + BN > seq.skv) wg::fence_async_smem();  // copied by cp.async: the generic proxy
  }
  for (int step = 0; step < w.steps; ++step) {
    const int stage = step % Cfg::kStages;
    const int h = w.head(step), m0 = w.row0(step, BM);
    const uint32_t sQ = sm.q(stage), sDO = sm.dout(stage), sDS = sm.ds(step);
    const float* s_lse = sm.stats + stage * Cfg::kStatBytes / 4;
    const float* s_delta = s_lse + BM;
    tma::wait(sm.full(stage), (step / Cfg::kStages) & 1);
    wg::fence_async_smem();  // the statistics (and a tile past the sequence end) came by cp.async

    // S^T = K Q^T and dP^T = V dO^T for this consumer's 64 keys.
    float sp[BM / 2], dp[BM / 2];
    wg::fence();
#pragma unroll
    for (int k = 0; k < D / 16; ++k)
      wg::Mma<T, BM>::template ss<0, 0>(sp, wg::desc_k(sm.k, BN, wgi * 64, k), wg::desc_k(sQ, BM, 0, k), k > 0);
    wg::commit();
#pragma unroll
    for (int k = 0; k < D / 16; ++k)
      wg::Mma<T, BM>::template ss<0, 0>(dp, wg::desc_k(sm.v, BN, wgi * 64, k), wg::desc_k(sDO, BM, 0, k), k > 0);
    wg::commit();
    wg::wait<1>();
    wg::keep(sp);
    probabilities_t<BM, BN>(sp, s_lse, s, seq, m0, n0, key0, t, scale_log2);
    // P^T and dS^T = P^T (dP^T - Delta) * scale as register operands, dS^T also into shared memory for dQ, and
    // dV += P^T dO.
    uint32_t pt[BM / 16][4], dst[BM / 16][4];
    auto issue_dv = [&] {
      wg::fence();
#pragma unroll
      for (int k = 0; k < BM / 16; ++k) wg::Mma<T, D>::template rs<1>(dv, pt[k], wg::desc_mn(sDO, BM, k, 0), 1);
      wg::commit();
    };
    if constexpr (Cfg::kDvAfterDs) {
      wg::wait<0>();
      wg::keep(dp);
      to_a_with_score_grads<T, BM>(sp, dp, s_delta, s.scale, t, pt, dst);
      store_ds_t<BM, BN>(sDS, dst, wgi * 64 + warp * 16 + g, t);
      issue_dv();
    } else {
      wg::acc_to_a<T, BM>(sp, pt);
      issue_dv();
      wg::wait<0>();
      wg::keep(dv);
      wg::keep(pt);
      wg::keep(dp);
      score_grads_t<BM>(dp, sp, s_delta, s.scale, t);
      wg::acc_to_a<T, BM>(dp, dst);
      store_ds_t<BM, BN>(sDS, dst, wgi * 64 + warp * 16 + g, t);
    }

    // This consumer's block of dQ = dS K over every key of the tile, once dS^T is complete: its own 64 query rows
    // (kDqByRows) or its own 64 columns. dQ's GEMM goes first, so that its reductions overlap dK's GEMM.
    const int dq_panel = Cfg::kDqByRows ? wgi : 0, dq_col0 = Cfg::kDqByRows ? 0 : 64 * wgi;
    const int dq_row0 = m0 + (Cfg::kDqByRows ? 64 * wgi : 0);
    float dq[Cfg::kDqCols / 2];
    wg::fence_async_smem();
    wg::named_sync(3, Cfg::kConsumers * 128);
    wg::fence();
#pragma unroll
    for (int k = 0; k < BN / 16; ++k)
      wg::Mma<T, Cfg::kDqCols>::template ss<1, 1>(dq, wg::desc_mn(sDS, BN, k, dq_panel),
                                                  wg::desc_mn(sm.k, BN, k, dq_col0 / 64), k > 0);
    wg::commit();
    // dK += dS^T Q
#pragma unroll
    for (int k = 0; k < BM / 16; ++k) wg::Mma<T, D>::template rs<1>(dk, dst[k], wg::desc_mn(sQ, BM, k, 0), 1);
    wg::commit();
    wg::wait<1>();
    wg::keep(dq);
    if (!Cfg::kDqByRows || dq_row0 < seq.sq)  // the second 64 rows of a sequence's last tile may lie past its end
      reduce_dq<Cfg::kDqCols>(dq_tile<D>(a, h, tile_base + dq_row0 / 64, dq_col0), dq, warp, lane);
    wg::wait<0>();
    // The step's GEMMs are done, so its Q, dO and statistics are read. Every thread arrives: its own plain loads of
    // the statistics precede its own arrival, so the producer's refill is ordered after all of them.
    wg::keep(dk);
    wg::keep(dv);
    wg::keep(pt);
    wg::keep(dst);
    tma::arrive(sm.empty(stage));
  }
  store_key_grad<T, D>(c.dk, dk, w, key0, t, c.accumulate);
  store_key_grad<T, D>(c.dv, dv, w, key0, t, c.accumulate);
}

// Head dims 192 and 256: both consumers work on the CTA's 64 keys, split by gradient. Per query tile
//  - the dV consumer computes S^T = K Q^T and P^T, hands P^T (fp32) to the other through shared memory, and adds
//    dV += P^T dO;
//  - the dK consumer computes dP^T = V dO^T and, with that P^T, dS^T (into shared memory for dQ), and adds
//    dK += dS^T Q;
//  - each adds columns of dQ = dS K to the accumulator from registers: [0, 128) the dV consumer, [128, D) the other.
// Two named barriers per step: P^T written (the dV consumer arrives, the dK consumer waits) and dS^T written (both
// wait). They also order the single buffers' reuse: the dV consumer writes the next P^T only after the dS^T
// barrier, which the dK consumer reaches after reading this P^T; the dK consumer writes the next dS^T only after the
// next P^T barrier, which the dV consumer reaches after its dQ GEMMs have read this dS^T.
template <typename T, int D, bool kDvSide>
__device__ __forceinline__ void consume_bwd_split(const BwdSm90Args& a, const BwdSmem<D>& sm, const BwdTile& w,
                                                  int ctid) {
  using Cfg = BwdSm90Config<D>;
  constexpr int BM = Cfg::BM, BN = Cfg::BN, kPtWritten = 1, kDsWritten = 2;
  constexpr int kDqCol0 = kDvSide ? 0 : 128, kDqCols = kDvSide ? 128 : D - 128;  // this side's columns of dQ
  const FlashBwdCall& c = a.c;
  const FlashShape& s = c.s;
  const Seq& seq = w.seq;
  const int n0 = w.n0, warp = ctid % 128 / 32, lane = ctid % 32, g = lane / 4, t = lane % 4;
  const int key0 = n0 + warp * 16 + g;  // this thread's keys: key0, key0 + 8
  const int64_t tile_base = dq_tile_base(s, w.b);
  const float scale_log2 = s.scale * kLog2e;
  // P^T as [BM / 8][128 threads] float4: a thread's 32 values, a warp's accesses contiguous.
  const uint32_t pt_slot = sm.pt + ctid % 128 * 16;

  float grad[D / 2];  // dV or dK of this thread's keys
#pragma unroll
  for (int i = 0; i < D / 2; ++i) grad[i] = 0.f;
  if (w.steps > 0) {
    tma::wait(sm.full_kv(), 0);
    if (n0 + BN > seq.skv) wg::fence_async_smem();  // copied by cp.async: the generic proxy
  }
  for (int step = 0; step < w.steps; ++step) {
    const int stage = step % Cfg::kStages;
    const int h = w.head(step), m0 = w.row0(step, BM);
    const uint32_t sQ = sm.q(stage), sDO = sm.dout(stage), sDS = sm.ds(step);
    const float* s_lse = sm.stats + stage * Cfg::kStatBytes / 4;
    tma::wait(sm.full(stage), (step / Cfg::kStages) & 1);
    wg::fence_async_smem();  // the statistics (and a tile past the sequence end) came by cp.async

    // S^T = K Q^T (dV side) or dP^T = V dO^T (dK side).
    float sc[BM / 2];
    wg::fence();
#pragma unroll
    for (int k = 0; k < D / 16; ++k)
      wg::Mma<T, BM>::template ss<0, 0>(sc, wg::desc_k(kDvSide ? sm.k : sm.v, BN, 0, k),
                                        wg::desc_k(kDvSide ? sQ : sDO, BM, 0, k), k > 0);
    wg::commit();
    wg::wait<0>();
    wg::keep(sc);
    uint32_t frag[BM / 16][4];  // P^T or dS^T as register-A fragments
    if constexpr (kDvSide) {
      probabilities_t<BM, BN>(sc, s_lse, s, seq, m0, n0, key0, t, scale_log2);
#pragma unroll
      for (int i = 0; i < BM / 8; ++i)
        asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(pt_slot + i * 128 * 16), "f"(sc[4 * i]),
                     "f"(sc[4 * i + 1]), "f"(sc[4 * i + 2]), "f"(sc[4 * i + 3]));
      tma::named_arrive(kPtWritten, 2 * 128);
      wg::acc_to_a<T, BM>(sc, frag);
    } else {
      float pt[BM / 2];
      wg::named_sync(kPtWritten, 2 * 128);
#pragma unroll
      for (int i = 0; i < BM / 8; ++i)
        asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                     : "=f"(pt[4 * i]), "=f"(pt[4 * i + 1]), "=f"(pt[4 * i + 2]), "=f"(pt[4 * i + 3])
                     : "r"(pt_slot + i * 128 * 16));
      score_grads_t<BM>(sc, pt, s_lse + BM, s.scale, t);
      wg::acc_to_a<T, BM>(sc, frag);
      store_ds_t<BM, BN>(sDS, frag, warp * 16 + g, t);
      wg::fence_async_smem();
    }

    // dV += P^T dO or dK += dS^T Q.
    wg::fence();
#pragma unroll
    for (int k = 0; k < BM / 16; ++k) wg::mma_rs_wide<T, D>(grad, frag[k], kDvSide ? sDO : sQ, BM, k);
    wg::commit();

    // This side's columns of dQ = dS K, once dS^T is complete. (Issued after the gradient's GEMM has completed: the
    // fragments it reads are then free, and the registers suffice.)
    wg::named_sync(kDsWritten, 2 * 128);
    wg::wait<0>();
    wg::keep(grad);
    wg::keep(frag);
    float dq[kDqCols / 2];
    wg::fence();
#pragma unroll
    for (int k = 0; k < BN / 16; ++k)
      wg::Mma<T, kDqCols>::template ss<1, 1>(dq, wg::desc_mn(sDS, BN, k, 0), wg::desc_mn(sm.k, BN, k, kDqCol0 / 64),
                                             k > 0);
    wg::commit();
    wg::wait<0>();
    wg::keep(dq);
    // Every thread arrives: its own plain loads of the statistics precede its arrival (see consume_bwd).
    tma::arrive(sm.empty(stage));
    reduce_dq<kDqCols>(dq_tile<D>(a, h, tile_base + m0 / BM, kDqCol0), dq, warp, lane);
  }
  store_key_grad<T, D>(kDvSide ? c.dv : c.dk, grad, w, key0, t, c.accumulate);
}

template <typename T, int D>
__global__ void __launch_bounds__(BwdSm90Config<D>::kThreads, 1)
    flash_bwd_sm90_kernel(const __grid_constant__ BwdMaps maps, const BwdSm90Args a, const HeaviestFirst order) {
  using Cfg = BwdSm90Config<D>;
  extern __shared__ unsigned char smem[];
  const BwdSmem<D> sm(smem);
  const FlashShape& s = a.c.s;
  BwdTile w;
  const TileOfCta t = order.at(blockIdx.x);
  w.b = t.batch;
  w.hk = t.head;
  w.n0 = t.tile * Cfg::BN;
  w.group = s.heads_q / s.heads_kv;
  w.seq = seq_of(s, w.b);
  if (w.n0 >= w.seq.skv) return;
  const TileRange tiles = query_tiles(s, w.seq, w.n0, w.n0 + Cfg::BN, Cfg::BM);
  w.mb_first = tiles.first;
  w.mb_count = max(0, tiles.end - tiles.first);
  w.steps = w.group * w.mb_count;
  const int tid = threadIdx.x;
  if (tid == 0) {
    tma::barrier_init(sm.full_kv(), 1);
    for (int st = 0; st < Cfg::kStages; ++st) {
      tma::barrier_init(sm.full(st), 1);
      tma::barrier_init(sm.empty(st), 128 * Cfg::kConsumers);
    }
    tma::barrier_init_fence();
  }
  __syncthreads();
  const int warpgroup = tma::warpgroup_index();
  if (warpgroup == 0) {
    tma::release_registers<Cfg::kProducerRegs>();
    if (tid < 32 && w.steps > 0) produce_bwd<D>(maps, a, sm, w, tid);
    return;
  } else {
    tma::claim_registers<Cfg::kConsumerRegs>();
    if constexpr (Cfg::kSplitByGradient) {
      if (warpgroup == 1) consume_bwd_split<T, D, true>(a, sm, w, tid - 128);
      else consume_bwd_split<T, D, false>(a, sm, w, tid - 128);
    } else {
      consume_bwd<T, D>(a, sm, w, warpgroup - 1, tid - 128);
    }
  }
}

// dq (or dq +=, when accumulate) = the accumulator, one CTA per (query tile, head, sequence).
template <typename T, int D>
__global__ void flash_dq_convert_sm90_kernel(BwdSm90Args a) {
  const FlashBwdCall& c = a.c;
  const int b = blockIdx.z, h = blockIdx.y, m0 = blockIdx.x * 64;
  const Seq seq = seq_of(c.s, b);
  if (m0 >= seq.sq) return;
  const float* src = dq_tile<D>(a, h, dq_tile_base(c.s, b) + blockIdx.x, 0);
  for (int pair = threadIdx.x; pair < 64 * D / 2; pair += blockDim.x) {
    const int r = pair / (D / 2), col = pair % (D / 2) * 2;
    if (m0 + r >= seq.sq) break;
    const float2 v = *reinterpret_cast<const float2*>(src + dq_acc_index(r, col));
    store_pair<T>(c.dq.ptr, c.dq.elem, row_off(c.dq, b, seq.q_row0 + m0 + r, h) + col, v.x, v.y, c.accumulate);
  }
}

template <typename T, int D>
void launch_bwd(const FlashBwdCall& c, const FlashStats& delta, cudaStream_t stream) {
  using Cfg = BwdSm90Config<D>;
  const FlashShape& s = c.s;
  BwdSm90Args a{c, delta, nullptr, 0};
  a.tiles_per_head = s.cu_q ? s.total_q / 64 + s.batch + 1 : int64_t(s.batch) * ((s.seqlen_q + 63) / 64);
  const size_t acc_bytes = static_cast<size_t>(a.tiles_per_head * s.heads_q) * 64 * D * 4;
  StreamScratch acc(acc_bytes, stream, "flash backward dQ accumulator");
  a.dq_acc = reinterpret_cast<float*>(acc.bytes());
  RT_CUDA_CHECK(cudaMemsetAsync(a.dq_acc, 0, acc_bytes, stream),
                cat("zeroing the flash dQ accumulator", flash_shape_str(s)));

  const bool packed = s.cu_q != nullptr;
  const int batches = packed ? 1 : s.batch;
  const int64_t q_rows = packed ? s.total_q : s.seqlen_q, kv_rows = packed ? s.total_kv : s.seqlen_kv;
  BwdMaps maps;
  maps.q = panel_map(c.q, q_rows, s.heads_q, batches, D, Cfg::BM, "q");
  maps.dout = panel_map(c.dout, q_rows, s.heads_q, batches, D, Cfg::BM, "dout");
  maps.k = panel_map(c.k, kv_rows, s.heads_kv, batches, D, Cfg::BN, "k");
  maps.v = panel_map(c.v, kv_rows, s.heads_kv, batches, D, Cfg::BN, "v");
  auto kernel = flash_bwd_sm90_kernel<T, D>;
  RT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes),
                cat("flash_bwd_sm90_kernel<D=", D, ">: setting ", Cfg::kSmemBytes, " bytes of shared memory"));
  const HeaviestFirst order((s.seqlen_kv + Cfg::BN - 1) / Cfg::BN, s.heads_kv, s.batch, s.mask != kMaskNone, false,
                            ringtrain::cuda::sm_count());
  const dim3 grid = order.grid();
  if (grid.x > 0) {
    kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(maps, a, order);
    RT_CUDA_CHECK(cudaGetLastError(), cat("launching flash_bwd_sm90_kernel grid (", grid.x, ")", flash_shape_str(s)));
  }
  const dim3 q_grid((s.seqlen_q + 63) / 64, s.heads_q, s.batch);
  flash_dq_convert_sm90_kernel<T, D><<<q_grid, 256, 0, stream>>>(a);
  RT_CUDA_CHECK(cudaGetLastError(), cat("launching flash_dq_convert_sm90_kernel", flash_shape_str(s)));
}

template <typename T>
void launch_bwd_for_head_dim(const FlashBwdCall& c, const FlashStats& delta, cudaStream_t stream) {
  switch (c.s.head_dim) {
    case 64: return launch_bwd<T, 64>(c, delta, stream);
    case 128: return launch_bwd<T, 128>(c, delta, stream);
    case 192: return launch_bwd<T, 192>(c, delta, stream);
    case 256: return launch_bwd<T, 256>(c, delta, stream);
    default: throw Error(cat("flash (cuda): no backward kernel for head dim ", c.s.head_dim, flash_shape_str(c.s)));
  }
}

}  // namespace

void flash_backward_sm90(const FlashBwdCall& c, const FlashStats& delta, cudaStream_t stream) {
  // No query rows: nothing to write. (Without keys dq is still written: zeros, or unchanged when accumulating.)
  if (c.s.total_q == 0) return;
  if (c.s.bf16) launch_bwd_for_head_dim<__nv_bfloat16>(c, delta, stream);
  else launch_bwd_for_head_dim<__half>(c, delta, stream);
}

}  // namespace ringtrain::attention::cuda
