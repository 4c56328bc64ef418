// The `flash` backward on Hopper (fast mode): wgmma tensor cores in the FlashAttention-3 structure, without a
// producer warp. One CTA of two warpgroups per (key tile of 128 keys, kv head, sequence); each warpgroup owns 64
// keys and keeps their dK and dV in registers while the CTA walks every query tile (64 rows) of every query head
// of the GQA group that can see them (causally and within a sliding window), Q / dO / LSE / Delta double-buffered
// through cp.async. Per query tile, each warpgroup computes
//   S^T = K Q^T and dP^T = V dO^T (shared operands), P^T and dS^T = P^T (dP^T - Delta) * scale in registers,
//   dV += P^T dO and dK += dS^T Q (P^T and dS^T as register operands),
//   and a 64 x 64 share of dQ = dS K from dS^T in shared memory: head dim 128 splits dQ's columns between the
//   warpgroups, head dim 64 its keys.
// Each share is added to an fp32 accumulator in global memory by one bulk reduction (cp.reduce.async.bulk) of a
// 16 KB staging block, in the order the registers hold it; flash_dq_convert_sm90_kernel reads that order back into
// dq. The accumulator holds, per query head, one 64 x D block per query tile (dq_tile_base).
#include "ringtrain/attention/cuda/cuda_util.h"
#include "ringtrain/attention/cuda/flash_sm90.h"
#include "ringtrain/attention/cuda/flash_tile.cuh"
#include "ringtrain/attention/cuda/wgmma.cuh"

namespace ringtrain::attention::cuda {
namespace {

using namespace tile;

template <int D>
struct BwdSm90Config {
  static constexpr int kThreads = 256, BM = 64, BN = 128;
  static constexpr int kTileKV = BN * D * 2, kTileQ = BM * D * 2;
  static constexpr int kDsBytes = BN * BM * 2;  // dS^T, [BN keys][BM queries]
  static constexpr int kDqBlock = BM * 64 * 4;  // one warpgroup's dQ share, 64 x 64 fp32
  // dQ share of warpgroup w: head dim 128 -> columns [64w, 64w + 64) over all keys (block w of the tile);
  // head dim 64 -> all columns over keys [64w, 64w + 64) (both add into block 0).
  static constexpr int kDqKeySteps = D == 128 ? BN / 16 : 4;
  static constexpr int kSmemBytes = 2 * kTileKV + 4 * kTileQ + kDsBytes + 2 * kDqBlock + 2 * 2 * BM * 4 + 1024;
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

// Position (in floats) of dQ element (r, c) of a 64 x D tile in the staging order of the kernel: block c / 64,
// then warp r / 16, column group, row half, lane, pair element.
template <int D>
__device__ __forceinline__ int dq_staged_index(int r, int c) {
  const int cc = c % 64, lane = 4 * (r % 8) + (cc % 8) / 2;
  const int slot = (((r / 16) * 8 + cc / 8) * 2 + (r % 16) / 8) * 32 + lane;
  return (D == 128 ? (c / 64) * 64 * 64 : 0) + 2 * slot + cc % 2;
}

template <typename T, int D>
__global__ void __launch_bounds__(256, 1) flash_bwd_sm90_kernel(BwdSm90Args a) {
  using Cfg = BwdSm90Config<D>;
  constexpr int BM = Cfg::BM, BN = Cfg::BN;
  extern __shared__ unsigned char smem[];
  const uint32_t sK = (smem_u32(smem) + 1023) & ~1023u, sV = sK + Cfg::kTileKV, sQ0 = sV + Cfg::kTileKV;
  const uint32_t sDO0 = sQ0 + 2 * Cfg::kTileQ, sDS = sDO0 + 2 * Cfg::kTileQ, sDQ = sDS + Cfg::kDsBytes;
  const uint32_t sStat = sDQ + 2 * Cfg::kDqBlock;  // per buffer: BM LSE values, then BM Delta values
  const float* stat = reinterpret_cast<const float*>(smem + (sStat - smem_u32(smem)));

  const auto& c = a.c;
  const FlashShape& s = c.s;
  const int group = s.heads_q / s.heads_kv;
  const int b = blockIdx.z, hk = blockIdx.y, n0 = blockIdx.x * BN;
  const Seq seq = seq_of(s, b);
  if (n0 >= seq.skv) return;
  const int tid = threadIdx.x, wgi = tid / 128, warp = (tid % 128) / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const bool causal = s.mask != kMaskNone;
  const int key0 = n0 + wgi * 64 + warp * 16 + g;  // this thread's keys: key0, key0 + 8

  // Query tiles that see any of these keys (causally, and within a sliding window).
  const TileRange tiles = query_tiles(s, seq, n0, n0 + BN, BM);
  const int mb_first = tiles.first, mb_count = max(0, tiles.end - tiles.first);
  const int steps = group * mb_count;
  const int64_t tile_base = dq_tile_base(s, b);

  auto prefetch = [&](int step, int buf) {
    const int h = hk * group + step / mb_count, m0 = (mb_first + step % mb_count) * BM, rows = seq.sq - m0;
    wg::load_panels<BM, D, Cfg::kThreads>(
        sQ0 + buf * Cfg::kTileQ, static_cast<const uint16_t*>(c.q.ptr) + row_off(c.q, b, seq.q_row0 + m0, h),
        c.q.row_stride, rows, tid);
    wg::load_panels<BM, D, Cfg::kThreads>(
        sDO0 + buf * Cfg::kTileQ, static_cast<const uint16_t*>(c.dout.ptr) + row_off(c.dout, b, seq.q_row0 + m0, h),
        c.dout.row_stride, rows, tid);
    if (tid < 2 * BM) {
      const int i = tid % BM;
      const FlashStats& src = tid < BM ? c.lse : a.delta;
      const bool ok = i < rows;
      cp_async4(sStat + (buf * 2 * BM + tid) * 4, ok ? src.ptr + stat_off(src, b, seq.q_row0 + m0 + i, h) : src.ptr,
                ok);
    }
  };

  const int keys = seq.skv - n0;
  wg::load_panels<BN, D, Cfg::kThreads>(
      sK, static_cast<const uint16_t*>(c.k.ptr) + row_off(c.k, b, seq.kv_row0 + n0, hk), c.k.row_stride, keys, tid);
  wg::load_panels<BN, D, Cfg::kThreads>(
      sV, static_cast<const uint16_t*>(c.v.ptr) + row_off(c.v, b, seq.kv_row0 + n0, hk), c.v.row_stride, keys, tid);
  if (steps > 0) prefetch(0, 0);
  cp_async_commit();

  const float scale_log2 = s.scale * kLog2e;
  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;
  const int dq_key_step0 = D == 128 ? 0 : wgi * 4, dq_panel = D == 128 ? wgi : 0;
  const uint32_t s_dq = sDQ + wgi * Cfg::kDqBlock;

  for (int step = 0; step < steps; ++step) {
    const int buf = step & 1;
    const int h = hk * group + step / mb_count, m0 = (mb_first + step % mb_count) * BM;
    const uint32_t sQ = sQ0 + buf * Cfg::kTileQ, sDO = sDO0 + buf * Cfg::kTileQ;
    const float* s_lse = stat + buf * 2 * BM;
    const float* s_delta = s_lse + BM;
    wg::cp_async_wait<0>();
    wg::fence_async_smem();
    __syncthreads();  // this step's tiles visible; every warpgroup is done with the previous step's

    // S^T = K Q^T and dP^T = V dO^T for this warpgroup's 64 keys; the next step's copies go out meanwhile.
    float sp[BM / 2], dp[BM / 2];
    wg::fence();
#pragma unroll
    for (int k = 0; k < D / 16; ++k)
      wg::Mma<T, BM>::template ss<0, 0>(sp, wg::desc_k(sK, BN, wgi * 64, k), wg::desc_k(sQ, BM, 0, k), k > 0);
    wg::commit();
#pragma unroll
    for (int k = 0; k < D / 16; ++k)
      wg::Mma<T, BM>::template ss<0, 0>(dp, wg::desc_k(sV, BN, wgi * 64, k), wg::desc_k(sDO, BM, 0, k), k > 0);
    wg::commit();
    if (step + 1 < steps) {
      prefetch(step + 1, buf ^ 1);
      cp_async_commit();
    }
    wg::wait<1>();
    wg::keep(sp);

    // P^T, then zeros where the query row is past the sequence or cannot see the key (only tiles that have such).
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
    if (m0 + BM > seq.sq || n0 + BN > seq.skv || (causal && n0 + BN > m0 + 1 + seq.shift) ||
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
    uint32_t pt[BM / 16][4];
    wg::acc_to_a<T, BM>(sp, pt);

    // dV += P^T dO
    wg::fence();
#pragma unroll
    for (int k = 0; k < BM / 16; ++k) wg::Mma<T, D>::template rs<1>(dv, pt[k], wg::desc_mn(sDO, BM, k, 0), 1);
    wg::commit();
    wg::wait<1>();
    wg::keep(dp);

    // dS^T = P^T (dP^T - Delta) * scale, as register operands and, for dQ, into shared memory.
#pragma unroll
    for (int j = 0; j < BM / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float delta = s_delta[8 * j + 2 * t + e];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = 4 * j + 2 * half + e;
          dp[i] = sp[i] * (dp[i] - delta) * s.scale;
        }
      }
    }
    uint32_t dst[BM / 16][4];
    wg::acc_to_a<T, BM>(dp, dst);
#pragma unroll
    for (int j = 0; j < BM / 8; ++j) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int key = wgi * 64 + warp * 16 + g + 8 * half;
        asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(sDS + wg::panel_off(BN, key, 8 * j + 2 * t)),
                     "r"(j % 2 == 0 ? dst[j / 2][half] : dst[j / 2][2 + half]));
      }
    }

    // dK += dS^T Q
    wg::fence();
#pragma unroll
    for (int k = 0; k < BM / 16; ++k) wg::Mma<T, D>::template rs<1>(dk, dst[k], wg::desc_mn(sQ, BM, k, 0), 1);
    wg::commit();

    wg::fence_async_smem();
    if (tid % 128 == 0) wg::bulk_wait_read();  // this warpgroup's previous dQ reduction has read its staging block
    __syncthreads();                            // dS^T complete
    float dq[32];
    wg::fence();
#pragma unroll
    for (int k = 0; k < Cfg::kDqKeySteps; ++k)
      wg::Mma<T, 64>::template ss<1, 1>(dq, wg::desc_mn(sDS, BN, dq_key_step0 + k, 0),
                                        wg::desc_mn(sK, BN, dq_key_step0 + k, dq_panel), k > 0);
    wg::commit();
    wg::wait<0>();
    wg::keep(dq);
    wg::keep(dk);
    wg::keep(dv);
    wg::keep(pt);
    wg::keep(dst);

    // This warpgroup's dQ share to its staging block (consecutive lanes, consecutive 8 bytes), then one bulk add.
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const uint32_t slot = ((warp * 8 + j) * 2 + half) * 32 + lane;
        asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(s_dq + slot * 8), "f"(dq[4 * j + 2 * half]),
                     "f"(dq[4 * j + 2 * half + 1]));
      }
    }
    wg::fence_async_smem();
    wg::named_sync(1 + wgi, 128);
    if (tid % 128 == 0) {
      float* acc_tile = a.dq_acc + (h * a.tiles_per_head + tile_base + m0 / BM) * BM * D;
      wg::bulk_reduce_add_f32(acc_tile + (D == 128 ? wgi * BM * 64 : 0), s_dq, Cfg::kDqBlock);
    }
  }
  if (tid % 128 == 0) wg::bulk_wait();

#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int key = key0 + 8 * half;
    if (key >= seq.skv) continue;
    const int64_t koff = row_off(c.dk, b, seq.kv_row0 + key, hk) + 2 * t;
    const int64_t voff = row_off(c.dv, b, seq.kv_row0 + key, hk) + 2 * t;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      store_pair<T>(c.dk.ptr, c.dk.elem, koff + 8 * j, dk[4 * j + 2 * half], dk[4 * j + 2 * half + 1], c.accumulate);
      store_pair<T>(c.dv.ptr, c.dv.elem, voff + 8 * j, dv[4 * j + 2 * half], dv[4 * j + 2 * half + 1], c.accumulate);
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
  const float* src = a.dq_acc + (h * a.tiles_per_head + dq_tile_base(c.s, b) + blockIdx.x) * 64 * D;
  for (int pair = threadIdx.x; pair < 64 * D / 2; pair += blockDim.x) {
    const int r = pair / (D / 2), col = pair % (D / 2) * 2;
    if (m0 + r >= seq.sq) break;
    const float2 v = *reinterpret_cast<const float2*>(src + dq_staged_index<D>(r, col));
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

  auto kernel = flash_bwd_sm90_kernel<T, D>;
  RT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes),
                cat("flash_bwd_sm90_kernel<D=", D, ">: setting ", Cfg::kSmemBytes, " bytes of shared memory"));
  const dim3 grid((s.seqlen_kv + Cfg::BN - 1) / Cfg::BN, s.heads_kv, s.batch);
  if (grid.x > 0) {
    kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(a);
    RT_CUDA_CHECK(cudaGetLastError(), cat("launching flash_bwd_sm90_kernel grid (", grid.x, ", ", grid.y, ", ",
                                          grid.z, ")", flash_shape_str(s)));
  }
  const dim3 q_grid((s.seqlen_q + 63) / 64, s.heads_q, s.batch);
  flash_dq_convert_sm90_kernel<T, D><<<q_grid, 256, 0, stream>>>(a);
  RT_CUDA_CHECK(cudaGetLastError(), cat("launching flash_dq_convert_sm90_kernel", flash_shape_str(s)));
}

}  // namespace

void flash_backward_sm90(const FlashBwdCall& c, const FlashStats& delta, cudaStream_t stream) {
  // No query rows: nothing to write. (Without keys dq is still written: zeros, or unchanged when accumulating.)
  if (c.s.total_q == 0) return;
  const bool d64 = c.s.head_dim == 64;
  if (c.s.bf16) {
    d64 ? launch_bwd<__nv_bfloat16, 64>(c, delta, stream) : launch_bwd<__nv_bfloat16, 128>(c, delta, stream);
  } else {
    d64 ? launch_bwd<__half, 64>(c, delta, stream) : launch_bwd<__half, 128>(c, delta, stream);
  }
}

}  // namespace ringtrain::attention::cuda
