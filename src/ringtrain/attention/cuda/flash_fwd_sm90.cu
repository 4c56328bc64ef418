// The `flash` forward on Hopper, warp-specialised in the FlashAttention-3 structure.
//
// One CTA per (query tile of BM rows, query head, sequence), 1 + BM / 64 warpgroups (flash_sm90_tiles.h):
//  - the producer (one warp of warpgroup 0, its registers given back) copies Q once and the K and V tiles of BN
//    keys into a ring of kStages shared-memory stages, each guarded by a full and an empty mbarrier (tma.cuh):
//    bulk-tensor (TMA) copies, or zero-filling cp.async for a tile that reaches past its sequence's end (TMA would
//    read the next sequence's rows there, and a V row that is not zero could turn 0 * V into NaN);
//  - consumers of 64 query rows each keep O and the scores in registers. Within a consumer the score GEMM of
//    tile n and the P V GEMM of tile n - 1 run on the tensor cores while the softmax of tile n runs; across them,
//    named barriers hand the tensor cores over in turn (ping-pong), so one consumer's GEMMs are issued while the
//    others compute their softmax.
// The epilogue normalises O once and stores it with the LSE: a consumer whose 64 rows all lie inside the sequence
// writes them into its rows of the Q tile and stores them with TMA (16-bit O); rows at a sequence's end, and an fp32
// O, go from registers.
#include <cuda.h>

#include "ringtrain/attention/cuda/cuda_util.h"
#include "ringtrain/attention/cuda/flash_sm90_schedule.cuh"
#include "ringtrain/attention/cuda/flash_sm90_tiles.h"
#include "ringtrain/attention/cuda/flash_tile.cuh"
#include "ringtrain/attention/cuda/online_softmax.cuh"
#include "ringtrain/attention/cuda/tma.cuh"
#include "ringtrain/attention/cuda/tma_map.h"
#include "ringtrain/attention/cuda/wgmma.cuh"

namespace ringtrain::attention::cuda {
namespace {

struct FwdMaps {
  CUtensorMap q, k, v;
  CUtensorMap o;  // made when O is 16-bit (an fp32 O is stored from registers)
  bool o_by_tma;
};

// Shared memory of one CTA: Q, the K and V rings (1024-byte aligned panel tiles) and their barriers.
template <int D>
struct FwdSmem {
  using Tiles = FwdSm90Shape<D>;
  static constexpr int kTileQ = Tiles::BM * D * 2, kTileKV = Tiles::BN * D * 2, kStages = Tiles::kStages;
  static constexpr int kBarriers = 1 + 4 * kStages;  // full Q; full/empty K and V per stage
  static constexpr int kBytes = 1024 + kTileQ + 2 * kStages * kTileKV + 8 * kBarriers;

  uint32_t q, k0, v0, bars;
  __device__ explicit FwdSmem(unsigned char* base) {
    q = (tile::smem_u32(base) + 1023) & ~1023u;
    k0 = q + kTileQ;
    v0 = k0 + kStages * kTileKV;
    bars = v0 + kStages * kTileKV;
  }
  __device__ uint32_t k(int stage) const { return k0 + stage * kTileKV; }
  __device__ uint32_t v(int stage) const { return v0 + stage * kTileKV; }
  __device__ uint32_t full_q() const { return bars; }
  __device__ uint32_t full_k(int stage) const { return bars + 8 * (1 + stage); }
  __device__ uint32_t empty_k(int stage) const { return bars + 8 * (1 + kStages + stage); }
  __device__ uint32_t full_v(int stage) const { return bars + 8 * (1 + 2 * kStages + stage); }
  __device__ uint32_t empty_v(int stage) const { return bars + 8 * (1 + 3 * kStages + stage); }
};

// What a CTA works on.
struct FwdTile {
  int b, h, hk, m0;  // sequence, query head, its kv head, first query row of the tile
  tile::Seq seq;
  int rows_valid;           // query rows of the tile inside the sequence
  int n_first, n_tiles;     // the key tiles any of them sees: [n_first, n_tiles) (n_first > 0 under a window)
};

// Producer: Q once, then K_n and V_n for n = 0 .. n_tiles - 1 into stage n % kStages as the consumers free it.
template <int D>
__device__ __forceinline__ void produce(const FwdMaps& maps, const FlashFwdCall& c, const FwdSmem<D>& sm,
                                        const FwdTile& w, int lane) {
  using Tiles = FwdSm90Shape<D>;
  constexpr int BM = Tiles::BM, BN = Tiles::BN, kStages = Tiles::kStages;
  const int batch_coord = c.s.cu_q ? 0 : w.b;  // packed tensors are one batch entry of all rows
  if (lane == 0) {
    tma::arrive_expect_bytes(sm.full_q(), FwdSmem<D>::kTileQ);
#pragma unroll
    for (int p = 0; p < D / 64; ++p)
      tma::load_4d(sm.q + p * BM * 128, &maps.q, sm.full_q(), p * 64, int(w.seq.q_row0) + w.m0, w.h, batch_coord);
  }
  const uint16_t* gk = static_cast<const uint16_t*>(c.k.ptr) + tile::row_off(c.k, w.b, w.seq.kv_row0, w.hk);
  const uint16_t* gv = static_cast<const uint16_t*>(c.v.ptr) + tile::row_off(c.v, w.b, w.seq.kv_row0, w.hk);
  auto load = [&](uint32_t dst, const CUtensorMap* map, uint32_t full, const uint16_t* g, int64_t stride, int n) {
    const int keys_left = w.seq.skv - n * BN;
    if (keys_left >= BN) {
      if (lane == 0) {
        tma::arrive_expect_bytes(full, FwdSmem<D>::kTileKV);
#pragma unroll
        for (int p = 0; p < D / 64; ++p)
          tma::load_4d(dst + p * BN * 128, map, full, p * 64, int(w.seq.kv_row0) + n * BN, w.hk, batch_coord);
      }
    } else {
      wg::load_panels_by_warp<BN, D>(dst, g + int64_t(n) * BN * stride, stride, keys_left, lane);
      tma::arrive_when_copied(full);
      __syncwarp();
      if (lane == 0) tma::arrive(full);
    }
  };
  for (int n = w.n_first; n < w.n_tiles; ++n) {
    const int use = n - w.n_first, stage = use % kStages;
    const uint32_t free_parity = ((use / kStages) & 1) ^ 1;
    tma::wait(sm.empty_k(stage), free_parity);
    load(sm.k(stage), &maps.k, sm.full_k(stage), gk, c.k.row_stride, n);
    tma::wait(sm.empty_v(stage), free_parity);
    load(sm.v(stage), &maps.v, sm.full_v(stage), gv, c.v.row_stride, n);
  }
}

// A consumer's 64 rows of O, all inside the sequence, through shared memory and one TMA store per 64-column panel:
// the rows go into the consumer's own rows of the Q tile (no other consumer reads them, and its last score GEMM has
// completed), in the 128-byte swizzle of the Q and O maps (16-byte chunk c of row r at chunk c ^ (r % 8)), which also
// keeps a warp's 4-byte writes on 32 distinct banks.
template <typename T, int D>
__device__ __forceinline__ void store_o_by_tma(const FwdMaps& maps, const FlashFwdCall& c, const FwdSmem<D>& sm,
                                               const FwdTile& w, int ci, int ctid, const float (&o)[D / 2],
                                               const float (&inv)[2]) {
  constexpr int BM = FwdSm90Shape<D>::BM;
  const int warp = (ctid % 128) / 32, lane = ctid % 32, g = lane / 4, t = lane % 4;
  const uint32_t rows = sm.q + ci * 64 * 128;  // panel p at + p * BM * 128
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = warp * 16 + g + 8 * half;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      const uint32_t at = rows + (j / 8) * BM * 128 + r * 128 + (((j % 8) ^ g) * 16) + 4 * t;
      const uint32_t pair = tile::pack2<T>(o[4 * j + 2 * half] * inv[half], o[4 * j + 2 * half + 1] * inv[half]);
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at), "r"(pair) : "memory");
    }
  }
  wg::fence_async_smem();
  wg::named_sync(1 + FwdSm90Shape<D>::kConsumers + ci, 128);  // past the ping-pong barriers 1 .. kConsumers
  if (ctid % 128 == 0) {
    const int batch_coord = c.s.cu_q ? 0 : w.b;
#pragma unroll
    for (int p = 0; p < D / 64; ++p)
      tma::store_4d(&maps.o, rows + p * BM * 128, p * 64, int(w.seq.q_row0) + w.m0 + ci * 64, w.h, batch_coord);
    tma::store_commit_and_wait_read();
  }
}

// Consumer `ci`: rows [64 ci, 64 ci + 64) of the tile.
template <typename T, int D>
__device__ __forceinline__ void consume(const FwdMaps& maps, const FlashFwdCall& c, const FwdSmem<D>& sm,
                                        const FwdTile& w, int ci, int ctid) {
  using Tiles = FwdSm90Shape<D>;
  constexpr int BM = Tiles::BM, BN = Tiles::BN, kStages = Tiles::kStages;
  const FlashShape& s = c.s;
  const int warp = (ctid % 128) / 32, lane = ctid % 32, g = lane / 4, t = lane % 4;
  const int row0 = w.m0 + ci * 64 + warp * 16 + g;  // this thread's rows: row0, row0 + 8

  // Ping-pong: consumer ci issues its GEMMs after waiting on barrier 1 + ci, then lets the next one go; the last
  // consumer lets consumer 0 start, and skips its final hand-over (nobody waits for it).
  constexpr int kConsumers = Tiles::kConsumers;
  const int my_turn = 1 + ci, next_turn = 1 + (ci + 1) % kConsumers;
  auto gemms_begin = [&] { wg::named_sync(my_turn, 2 * 128); };
  auto gemms_end = [&](bool last) {
    if (!(last && ci == kConsumers - 1)) tma::named_arrive(next_turn, 2 * 128);
  };
  auto release = [&](uint32_t empty) { tma::arrive_if(empty, lane == 0); };

  float o[D / 2], sc[BN / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  uint32_t p[BN / 16][4];  // P of the tile whose P V is issued next, 16-bit, register-A layout
  OnlineSoftmax<BN> softmax(s.scale);

  auto issue_qk = [&](int stage) {
    wg::fence();
#pragma unroll
    for (int k = 0; k < D / 16; ++k)
      wg::Mma<T, BN>::template ss<0, 0>(sc, wg::desc_k(sm.q, BM, ci * 64, k), wg::desc_k(sm.k(stage), BN, 0, k),
                                        k > 0);
    wg::commit();
  };
  // P V: one m64nD product per 16 keys (above D = 128 in m64n128 / m64n64 pieces over V's panels).
  auto issue_pv = [&](int stage) {
    // Above D = 128 the compiler sinks part of O's rescale past the fence unless tied here, and ptxas then adds a
    // wait (C7519).
    if constexpr (D > 128) wg::keep(o);
    wg::fence();
#pragma unroll
    for (int k = 0; k < BN / 16; ++k) wg::mma_rs_wide<T, D>(o, p[k], sm.v(stage), BN, k);
    wg::commit();
  };
  // Hides the keys of tile n that a row may not see; only tiles that reach past the sequence end, a row's causal
  // limit or the start of a row's window pay for it.
  auto mask = [&](int n) {
    const int n0 = n * BN;
    // The tile's last row starts latest. Recomputed per tile: holding it across the loop made the D = 128 consumer
    // spill.
    const bool before_start = n0 < tile::key_start(s, w.seq, w.m0 + BM - 1);
    if (!before_start && n0 + BN <= w.seq.skv && (s.mask == kMaskNone || n0 + BN <= w.m0 + 1 + w.seq.shift)) return;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int lim = tile::key_limit(s, w.seq, row0 + 8 * half) - n0;
      const int start = tile::key_start(s, w.seq, row0 + 8 * half) - n0;
#pragma unroll
      for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = 8 * j + 2 * t + e;
          if (key >= lim || key < start) sc[4 * j + 2 * half + e] = -INFINITY;
        }
    }
  };
  // A tile copied by cp.async (it reaches past the sequence end) was written through the generic proxy.
  auto wait_full = [&](uint32_t full, int n) {
    tma::wait(full, ((n - w.n_first) / kStages) & 1);
    if ((n + 1) * BN > w.seq.skv) wg::fence_async_smem();
  };

  tma::wait(sm.full_q(), 0);
  if (ci == kConsumers - 1) tma::named_arrive(1, 2 * 128);  // consumer 0 goes first

  // Tile 0: scores and softmax; nothing to rescale yet. alpha carries a softmax's rescale factor to the next
  // iteration, which applies it while the tensor cores compute that iteration's scores.
  // Stage of key tile n: (n - n_first) % kStages.
  auto stage_of = [&](int n) { return (n - w.n_first) % kStages; };
  float alpha[2];
  wait_full(sm.full_k(0), w.n_first);
  gemms_begin();
  issue_qk(0);
  gemms_end(false);
  wg::wait<0>();
  wg::keep(sc);
  release(sm.empty_k(0));
  mask(w.n_first);
  softmax.update(sc, alpha);
  wg::acc_to_a<T, BN>(sc, p);
  for (int n = w.n_first + 1; n < w.n_tiles; ++n) {
    const int stage = stage_of(n), prev = stage_of(n - 1);
    wait_full(sm.full_k(stage), n);
    wait_full(sm.full_v(prev), n - 1);
    gemms_begin();
    issue_qk(stage);
    OnlineSoftmax<BN>::rescale(o, alpha);
    issue_pv(prev);
    gemms_end(false);
    wg::wait<1>();
    wg::keep(sc);
    release(sm.empty_k(stage));
    mask(n);
    softmax.update(sc, alpha);
    wg::wait<0>();
    wg::keep(o);
    wg::keep(p);
    release(sm.empty_v(prev));
    wg::acc_to_a<T, BN>(sc, p);  // only now: P V of tile n - 1 read p until the wait
  }
  {
    const int last = stage_of(w.n_tiles - 1);
    wait_full(sm.full_v(last), w.n_tiles - 1);
    OnlineSoftmax<BN>::rescale(o, alpha);
    gemms_begin();
    issue_pv(last);
    gemms_end(true);
    wg::wait<0>();
    wg::keep(o);
    wg::keep(p);
    release(sm.empty_v(last));
  }

  // Epilogue: O = acc / l (0 for a row that saw no key), LSE = max * scale + ln(l) (-inf for such a row).
  float inv[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float l = softmax.total(half);
    inv[half] = l > 0.f ? 1.f / l : 0.f;
    const int row = row0 + 8 * half;
    if (t == 0 && row < w.seq.sq) c.lse.ptr[tile::stat_off(c.lse, w.b, w.seq.q_row0 + row, w.h)] = softmax.lse(half, l);
  }
  if (maps.o_by_tma && w.m0 + ci * 64 + 64 <= w.seq.sq) {
    store_o_by_tma<T, D>(maps, c, sm, w, ci, ctid, o, inv);
    return;
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + 8 * half;
    if (row >= w.seq.sq) continue;
    const int64_t ooff = tile::row_off(c.o, w.b, w.seq.q_row0 + row, w.h) + 2 * t;
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
      tile::store_pair<T>(c.o.ptr, c.o.elem, ooff + 8 * j, o[4 * j + 2 * half] * inv[half],
                          o[4 * j + 2 * half + 1] * inv[half], false);
  }
}

// Rows that see no key at all (an empty key range): O = 0, LSE = -inf, without touching K or V.
template <typename T, int D>
__device__ __forceinline__ void store_empty_rows(const FlashFwdCall& c, const FwdTile& w, int tid) {
  for (int r = tid; r < w.rows_valid; r += FwdSm90Shape<D>::kThreads) {
    const int64_t row = w.seq.q_row0 + w.m0 + r;
    const int64_t ooff = tile::row_off(c.o, w.b, row, w.h);
    for (int j = 0; j < D; j += 2) tile::store_pair<T>(c.o.ptr, c.o.elem, ooff + j, 0.f, 0.f, false);
    c.lse.ptr[tile::stat_off(c.lse, w.b, row, w.h)] = -INFINITY;
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(FwdSm90Shape<D>::kThreads, 1)
    flash_fwd_sm90_kernel(const __grid_constant__ FwdMaps maps, const FlashFwdCall c, const HeaviestFirst order) {
  using Tiles = FwdSm90Shape<D>;
  extern __shared__ unsigned char smem[];
  const FwdSmem<D> sm(smem);
  const FlashShape& s = c.s;

  FwdTile w;
  const TileOfCta t = order.at(blockIdx.x);
  w.b = t.batch;
  w.h = t.head;
  w.hk = w.h / (s.heads_q / s.heads_kv);
  w.m0 = t.tile * Tiles::BM;
  w.seq = tile::seq_of(s, w.b);
  if (w.m0 >= w.seq.sq) return;
  w.rows_valid = min(Tiles::BM, w.seq.sq - w.m0);
  w.n_tiles = (tile::key_limit(s, w.seq, w.m0 + w.rows_valid - 1) + Tiles::BN - 1) / Tiles::BN;
  w.n_first = min(w.n_tiles, tile::key_start(s, w.seq, w.m0) / Tiles::BN);  // tiles wholly before every window
  const int tid = threadIdx.x;
  if (w.n_first == w.n_tiles) {
    store_empty_rows<T, D>(c, w, tid);
    return;
  }

  if (tid == 0) {
    tma::prefetch_map(&maps.q);
    tma::prefetch_map(&maps.k);
    tma::prefetch_map(&maps.v);
    if (maps.o_by_tma) tma::prefetch_map(&maps.o);
    tma::barrier_init(sm.full_q(), 1);
    for (int st = 0; st < Tiles::kStages; ++st) {
      tma::barrier_init(sm.full_k(st), 1);
      tma::barrier_init(sm.full_v(st), 1);
      tma::barrier_init(sm.empty_k(st), 4 * Tiles::kConsumers);
      tma::barrier_init(sm.empty_v(st), 4 * Tiles::kConsumers);
    }
    tma::barrier_init_fence();
  }
  __syncthreads();

  const int warpgroup = tma::warpgroup_index();
  if (warpgroup == 0) {
    tma::release_registers<Tiles::kProducerRegs>();
    if (tid < 32) produce<D>(maps, c, sm, w, tid);
    return;
  } else {
    tma::claim_registers<Tiles::kConsumerRegs>();
    consume<T, D>(maps, c, sm, w, warpgroup - 1, tid - 128);
  }
}

template <typename T, int D>
void launch_fwd(const FlashFwdCall& c, cudaStream_t stream) {
  using Tiles = FwdSm90Shape<D>;
  constexpr int kSmem = FwdSmem<D>::kBytes;
  auto kernel = flash_fwd_sm90_kernel<T, D>;
  RT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
                cat("flash: flash_fwd_sm90_kernel<D=", D, ">: setting ", kSmem, " bytes of shared memory"));
  const bool packed = c.s.cu_q != nullptr;
  const int batches = packed ? 1 : c.s.batch;
  FwdMaps maps;
  maps.q = panel_map(c.q, packed ? c.s.total_q : c.s.seqlen_q, c.s.heads_q, batches, D, Tiles::BM, "q");
  const int64_t kv_rows = packed ? c.s.total_kv : c.s.seqlen_kv;
  maps.k = panel_map(c.k, kv_rows, c.s.heads_kv, batches, D, Tiles::BN, "k");
  maps.v = panel_map(c.v, kv_rows, c.s.heads_kv, batches, D, Tiles::BN, "v");
  maps.o_by_tma = c.o.elem != FlashElem::F32;
  maps.o = maps.o_by_tma ? panel_map(c.o, packed ? c.s.total_q : c.s.seqlen_q, c.s.heads_q, batches, D, 64, "o")
                         : CUtensorMap{};
  const HeaviestFirst order((c.s.seqlen_q + Tiles::BM - 1) / Tiles::BM, c.s.heads_q, c.s.batch, c.s.mask != kMaskNone,
                            true, ringtrain::cuda::sm_count());
  const dim3 grid = order.grid();
  kernel<<<grid, Tiles::kThreads, kSmem, stream>>>(maps, c, order);
  RT_CUDA_CHECK(cudaGetLastError(), cat("flash: launching flash_fwd_sm90_kernel<D=", D, "> grid (", grid.x, ")",
                                        flash_shape_str(c.s)));
}

template <typename T>
void launch_fwd_for_head_dim(const FlashFwdCall& c, cudaStream_t stream) {
  switch (c.s.head_dim) {
    case 64: return launch_fwd<T, 64>(c, stream);
    case 128: return launch_fwd<T, 128>(c, stream);
    case 192: return launch_fwd<T, 192>(c, stream);
    case 256: return launch_fwd<T, 256>(c, stream);
    default: throw Error(cat("flash (cuda): no forward kernel for head dim ", c.s.head_dim, flash_shape_str(c.s)));
  }
}

}  // namespace

void flash_forward(const FlashFwdCall& c, cudaStream_t stream) {
  if (c.s.seqlen_q == 0) return;
  if (c.s.bf16) launch_fwd_for_head_dim<__nv_bfloat16>(c, stream);
  else launch_fwd_for_head_dim<__half>(c, stream);
}

}  // namespace ringtrain::attention::cuda
