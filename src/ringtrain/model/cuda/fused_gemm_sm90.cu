// The persistent Hopper GEMM C = A · Bᵀ (A [M, K], B [N, K], row-major bf16, fp32 accumulators) with a fused
// epilogue (fused_gemm.h), in three pieces: the tile scheduler (TileGrid), the mainloop (a producer thread's TMA
// copies into an mbarrier ring, consumed by wgmma), and the epilogues (SwigluEpilogue, LogprobEpilogue), which see a
// consumer's 128 x 128 accumulator tile and decide what reaches memory.
//
// Ping-pong: the CTA's tiles go to its two consumers in turn. The ring holds the tiles' k blocks in order, so a
// consumer's mainloop follows the other's; named barriers 1 and 2 make the hand-over explicit, because a consumer may
// wait on a stage's `full` barrier only once that stage's previous use has been waited on (a parity wait cannot tell
// phase k from phase k - 2). A consumer hands over once its last wgmma is issued, then drains and runs its epilogue
// while the other's mainloop keeps the tensor cores busy.
#include <cuda.h>

#include <algorithm>
#include <cstdlib>
#include <string_view>

#include "ringtrain/attention/cuda/tma.cuh"
#include "ringtrain/attention/cuda/tma_map.h"
#include "ringtrain/attention/cuda/wgmma.cuh"
#include "ringtrain/core/error.h"
#include "ringtrain/model/cuda/exp_sums.cuh"
#include "ringtrain/model/cuda/fused_gemm.h"
#include "ringtrain/model/cuda/kernel_util.cuh"

namespace ringtrain::model::cuda {
namespace {

namespace tma = attention::cuda::tma;
namespace wg = attention::cuda::wg;

// kCoop = false (ping-pong): each consumer owns alternate 128 x 128 tiles. kCoop = true (cooperative): both work
// on one 256 x 128 tile, 128 rows each, sharing its B tile (a third less L2 traffic per FLOP).
template <bool kCoop>
struct Tiles {
  static constexpr int BM = kCoop ? 256 : 128, BN = 128, BK = 64;  // BK: one 128-byte swizzled panel
  static constexpr int kStages = kCoop ? 4 : 6, kConsumers = 2, kThreads = 128 * (1 + kConsumers);
  static constexpr int kProducerRegs = 40, kConsumerRegs = 232;
  static constexpr int kTileA = BM * BK * 2, kTileB = BN * BK * 2, kStageBytes = kTileA + kTileB;
  static constexpr int kSmemBytes = 1024 + kStages * kStageBytes + 2 * kStages * 8;
};

template <bool kCoop>
struct Smem {
  using T = Tiles<kCoop>;
  uint32_t base;
  __device__ explicit Smem(unsigned char* raw) { base = (attention::cuda::tile::smem_u32(raw) + 1023) & ~1023u; }
  __device__ uint32_t a(int stage) const { return base + stage * T::kStageBytes; }
  __device__ uint32_t b(int stage) const { return a(stage) + T::kTileA; }
  __device__ uint32_t full(int stage) const { return base + T::kStages * T::kStageBytes + 8 * stage; }
  __device__ uint32_t empty(int stage) const { return full(T::kStages) + 8 * stage; }
};

// A: boxes of 128 rows; B: boxes of 128 rows, or of 64 rows from two maps (b0 then b1) stacked into one B tile.
struct Maps {
  CUtensorMap a, b0, b1;
};

// Output tiles in M-fastest order: the CTAs at work at once share a few B tiles and sweep A, which stays in L2.
struct TileGrid {
  int tiles_m, bm;
  int64_t count;
  __device__ int m0(int64_t t) const { return static_cast<int>(t % tiles_m) * bm; }
  __device__ int n_tile(int64_t t) const { return static_cast<int>(t / tiles_m); }
};

template <bool kCoop, typename Epilogue>
__device__ __forceinline__ void produce(const Maps& maps, const Smem<kCoop>& sm, const TileGrid& grid, int k_blocks) {
  using Tiles = Tiles<kCoop>;
  int use = 0;  // ring use: stage use % kStages, round use / kStages
  for (int64_t t = blockIdx.x; t < grid.count; t += gridDim.x) {
    const int m0 = grid.m0(t), n_tile = grid.n_tile(t);
    for (int kb = 0; kb < k_blocks; ++kb, ++use) {
      const int stage = use % Tiles::kStages;
      tma::wait(sm.empty(stage), ((use / Tiles::kStages) & 1) ^ 1);
      tma::arrive_expect_bytes(sm.full(stage), Tiles::kStageBytes);
      tma::load_2d(sm.a(stage), &maps.a, sm.full(stage), kb * Tiles::BK, m0);
      if constexpr (Epilogue::kSplitB) {
        tma::load_2d(sm.b(stage), &maps.b0, sm.full(stage), kb * Tiles::BK, n_tile * (Tiles::BN / 2));
        tma::load_2d(sm.b(stage) + (Tiles::BN / 2) * 128, &maps.b1, sm.full(stage), kb * Tiles::BK,
                     n_tile * (Tiles::BN / 2));
      } else {
        tma::load_2d(sm.b(stage), &maps.b0, sm.full(stage), kb * Tiles::BK, n_tile * Tiles::BN);
      }
    }
  }
}

constexpr int kTileCols = 128;  // BN of every schedule: the epilogues' column tiles

// A consumer's accumulators: rows [64 h, 64 h + 64) of the tile in acc[h], in the wgmma layout (wgmma.cuh): thread
// (warp w, lane 4 g + t) holds rows 16 w + g (+ 8) and columns 8 j + 2 t (+ 1), j < 16.
using Acc = float[2][64];

template <bool kCoop, typename Epilogue>
__device__ __forceinline__ void consume(const Epilogue& ep, const Smem<kCoop>& sm, const TileGrid& grid, int k_blocks,
                                        int ci, int ctid) {
  using Tiles = Tiles<kCoop>;
  const int warp = ctid / 32, lane = ctid % 32;
  const int my_turn = 1 + ci, next_turn = 1 + (ci + 1) % Tiles::kConsumers;
  auto release = [&](int stage) { tma::arrive_if(sm.empty(stage), lane == 0); };
  if (!kCoop && ci == 1) tma::named_arrive(1, 2 * 128);  // consumer 0 goes first
  // Ping-pong: consumer ci takes the CTA's tiles ci, ci + 2, ...; cooperative: both take every tile, rows 128 ci on.
  constexpr int kStride = kCoop ? 1 : Tiles::kConsumers;
  const int row0 = kCoop ? 128 * ci : 0;

  Acc acc;
  int64_t local = kCoop ? 0 : ci;  // the tile's index among the CTA's tiles
  for (int64_t t = blockIdx.x + local * int64_t{gridDim.x}; t < grid.count;
       t += kStride * int64_t{gridDim.x}, local += kStride) {
    if (!kCoop) wg::named_sync(my_turn, 2 * 128);
    int use = static_cast<int>(local) * k_blocks;
    for (int kb = 0; kb < k_blocks; ++kb, ++use) {
      const int stage = use % Tiles::kStages;
      tma::wait(sm.full(stage), (use / Tiles::kStages) & 1);
      wg::fence();
#pragma unroll
      for (int k = 0; k < Tiles::BK / 16; ++k) {
        const uint64_t b = wg::desc_k(sm.b(stage), Tiles::BN, 0, k);
        wg::Mma<__nv_bfloat16, 128>::ss<0, 0>(acc[0], wg::desc_k(sm.a(stage), Tiles::BM, row0, k), b,
                                              kb > 0 || k > 0);
        wg::Mma<__nv_bfloat16, 128>::ss<0, 0>(acc[1], wg::desc_k(sm.a(stage), Tiles::BM, row0 + 64, k), b,
                                              kb > 0 || k > 0);
      }
      wg::commit();
      wg::wait<1>();
      wg::keep(acc[0]);
      wg::keep(acc[1]);
      if (kb > 0) release((use - 1) % Tiles::kStages);
    }
    // The next tile of this CTA is the other consumer's; past the CTA's last tile nobody waits for the hand-over.
    if (!kCoop && t + gridDim.x < grid.count) tma::named_arrive(next_turn, 2 * 128);
    wg::wait<0>();
    wg::keep(acc[0]);
    wg::keep(acc[1]);
    release((use - 1) % Tiles::kStages);
    ep.store(acc, grid.m0(t) + row0, grid.n_tile(t), warp, lane);
  }
}

template <bool kCoop, typename Epilogue>
__global__ void __launch_bounds__(Tiles<kCoop>::kThreads, 1)
    fused_gemm_kernel(const __grid_constant__ Maps maps, const Epilogue ep, const TileGrid grid, int k_blocks) {
  using Tiles = Tiles<kCoop>;
  extern __shared__ unsigned char smem[];
  const Smem<kCoop> sm(smem);
  const int tid = threadIdx.x;
  if (tid == 0) {
    tma::prefetch_map(&maps.a);
    tma::prefetch_map(&maps.b0);
    if constexpr (Epilogue::kSplitB) tma::prefetch_map(&maps.b1);
    for (int st = 0; st < Tiles::kStages; ++st) {
      tma::barrier_init(sm.full(st), 1);
      // lane 0 of each warp of the consumers that read the stage
      tma::barrier_init(sm.empty(st), kCoop ? 4 * Tiles::kConsumers : 4);
    }
    tma::barrier_init_fence();
  }
  __syncthreads();
  const int warpgroup = tma::warpgroup_index();
  if (warpgroup == 0) {
    tma::release_registers<Tiles::kProducerRegs>();
    if (tid == 0) produce<kCoop, Epilogue>(maps, sm, grid, k_blocks);
  } else {
    tma::claim_registers<Tiles::kConsumerRegs>();
    consume<kCoop>(ep, sm, grid, k_blocks, warpgroup - 1, tid % 128);
  }
}

// B tile = 64 gate rows, then the 64 up rows of the same features: accumulator column 8 j + 2 t + e is gate feature
// 64 n_tile + 8 j + 2 t + e for j < 8 and the matching up feature at j + 8, in the same thread.
struct SwigluEpilogue {
  static constexpr bool kSplitB = true;
  bf16* act;
  int64_t rows, ffn;

  __device__ __forceinline__ void store(const Acc& acc, int m0, int n_tile, int warp, int lane) const {
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int64_t row = m0 + 64 * h + 16 * warp + g + 8 * half;
        if (row >= rows) continue;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int64_t col = int64_t{n_tile} * 64 + 8 * j + 2 * t;  // even, and ffn % 8 == 0: col + 1 < ffn too
          if (col >= ffn) continue;
          float out[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float gate = acc[h][4 * j + 2 * half + e], up = acc[h][4 * (j + 8) + 2 * half + e];
            out[e] = gate / (1.f + expf(-gate)) * up;
          }
          store_bf16<2>(act + row * ffn + col, out);
        }
      }
  }
};

// Per row and 128-column tile: ExpSums of the tile's logits (columns past vocab excluded) as one float4 (max, Σe,
// Σe(z - max), unused), and the target's logit from whichever thread holds it.
template <bool Entropy>
struct LogprobEpilogue {
  static constexpr bool kSplitB = false;
  float4* partials;  // [rows, tiles_n]
  float* target_logit;
  const int32_t* targets;
  int64_t rows, vocab;
  int tiles_n;

  __device__ __forceinline__ void store(const Acc& acc, int m0, int n_tile, int warp, int lane) const {
    constexpr float kLog2e = 1.4426950408889634f;
    const int g = lane / 4, t = lane % 4;
    const int64_t col0 = int64_t{n_tile} * kTileCols;
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int64_t row = m0 + 64 * h + 16 * warp + g + 8 * half;
        const bool in_rows = row < rows;
        float z[32];
        float m = -INFINITY;
#pragma unroll
        for (int j = 0; j < 16; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const bool in_vocab = col0 + 8 * j + 2 * t + e < vocab;
            z[2 * j + e] = in_vocab ? acc[h][4 * j + 2 * half + e] : -INFINITY;
            m = fmaxf(m, z[2 * j + e]);
          }
        const float m_safe = m == -INFINITY ? 0.f : m;  // all masked: every exp is 0
        ExpSums<Entropy> s;
        float sum = 0.f, sum_ez = 0.f;
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          const float shifted = z[i] - m_safe, e = exp2f(shifted * kLog2e);
          sum += e;
          if constexpr (Entropy) sum_ez += e > 0.f ? e * shifted : 0.f;
        }
        // A NaN logit makes the sum NaN (fmaxf above drops it from the max).
        s.merge(m, sum, sum_ez);
        s.shuffle_merge(1);
        s.shuffle_merge(2);
        if (!in_rows) continue;
        const int32_t target = targets[row];
        const int64_t at = target - col0 - 2 * t;  // this thread holds columns col0 + 8 j + 2 t + e
        if (target >= 0 && at >= 0 && at < kTileCols && at % 8 < 2) {
#pragma unroll
          for (int i = 0; i < 32; ++i)
            if (i == 2 * (at / 8) + at % 8) target_logit[row] = z[i];
        }
        if (t == 0) partials[row * tiles_n + n_tile] = make_float4(s.max, s.sum, s.sum_ez, 0.f);
      }
  }
};

constexpr int kCombineThreads = 256;

// A warp per row: the row's tile partials merged, then logprob = target logit - lse and the entropy.
template <bool Entropy>
__global__ void combine_logprob_partials(float* out, float* entropy, const float4* partials,
                                         const float* target_logit, const int32_t* targets, int64_t rows,
                                         int tiles_n) {
  const int64_t row = blockIdx.x * int64_t{kCombineThreads / 32} + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  ExpSums<Entropy> s;
  for (int i = lane; i < tiles_n; i += 32) {
    const float4 p = partials[row * tiles_n + i];
    s.merge(p.x, p.y, p.z);
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) s.shuffle_merge(offset);
  if (lane != 0) return;
  const float log_sum = logf(s.sum), lse = s.max + log_sum;
  const int32_t target = targets[row];
  out[row] = target >= 0 ? target_logit[row] - lse : 0.f;
  if constexpr (Entropy) entropy[row] = log_sum - s.sum_ez / s.sum;
}

template <bool kCoop, typename Epilogue>
void launch_schedule(cudaStream_t s, const Maps& maps, const Epilogue& ep, int64_t m, int64_t tiles_n, int64_t k,
                     const char* what) {
  using Tiles = Tiles<kCoop>;
  auto kernel = fused_gemm_kernel<kCoop, Epilogue>;
  RT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tiles::kSmemBytes),
                cat("fused gemm (", what, "): setting ", Tiles::kSmemBytes, " bytes of shared memory"));
  const int64_t tiles_m = (m + Tiles::BM - 1) / Tiles::BM;
  RT_CHECK(tiles_m * tiles_n < (int64_t(1) << 40) && (k + Tiles::BK - 1) / Tiles::BK * tiles_m * tiles_n < INT32_MAX,
           "fused gemm (", what, "): ", m, " x ", tiles_n, " tiles of K = ", k, " exceed the ring's 32-bit count");
  const TileGrid grid{static_cast<int>(tiles_m), Tiles::BM, tiles_m * tiles_n};
  const unsigned ctas = static_cast<unsigned>(std::min<int64_t>(sm_count(), grid.count));
  kernel<<<ctas, Tiles::kThreads, Tiles::kSmemBytes, s>>>(maps, ep, grid,
                                                          static_cast<int>((k + Tiles::BK - 1) / Tiles::BK));
  RT_CUDA_CHECK_LAUNCH("fused_gemm_kernel (", what, ") m=", m, " tiles_n=", tiles_n, " k=", k);
}

bool cooperative_schedule() {
  const char* env = std::getenv("RINGTRAIN_FUSED_GEMM_COOP");
  return env && std::string_view(env) == "1";
}
int a_box_rows(bool coop) { return coop ? Tiles<true>::BM : Tiles<false>::BM; }

template <typename Epilogue>
void launch(bool coop, cudaStream_t s, const Maps& maps, const Epilogue& ep, int64_t m, int64_t tiles_n, int64_t k,
            const char* what) {
  if (coop) launch_schedule<true>(s, maps, ep, m, tiles_n, k, what);
  else launch_schedule<false>(s, maps, ep, m, tiles_n, k, what);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool fused_epilogues_enabled() {
  const char* env = std::getenv("RINGTRAIN_FUSED_EPILOGUES");
  if (env && std::string_view(env) == "0") return false;
  int dev = 0, major = 0;
  RT_CUDA_CHECK(cudaGetDevice(&dev));
  RT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "the compute capability");
  return major == 9;
}

bool fused_swiglu_fits(const bf16* act, const bf16* x, const bf16* w_gate_up, int64_t in, int64_t ffn) {
  return in > 0 && ffn > 0 && in % 8 == 0 && ffn % 8 == 0 && aligned16(act) && aligned16(x) && aligned16(w_gate_up);
}

void fused_gate_up_swiglu(cudaStream_t s, bf16* act, const bf16* x, const bf16* w_gate_up, int64_t n, int64_t in,
                          int64_t ffn) {
  if (n == 0) return;
  RT_CHECK(fused_swiglu_fits(act, x, w_gate_up, in, ffn), "fused gate/up + SwiGLU: in = ", in, " and ffn = ", ffn,
           " must be positive multiples of 8 and the operands 16-byte aligned");
  const bool coop = cooperative_schedule();
  Maps maps;
  maps.a = attention::cuda::matrix_map(x, n, in, in, a_box_rows(coop), "mlp input");
  maps.b0 = attention::cuda::matrix_map(w_gate_up, ffn, in, in, kTileCols / 2, "gate_proj");
  maps.b1 = attention::cuda::matrix_map(w_gate_up + ffn * in, ffn, in, in, kTileCols / 2, "up_proj");
  const SwigluEpilogue ep{act, n, ffn};
  launch(coop, s, maps, ep, n, (ffn + kTileCols / 2 - 1) / (kTileCols / 2), in, "gate/up + SwiGLU");
}

bool fused_logprobs_fit(const bf16* hidden, const bf16* lm_head, int64_t in) {
  return in > 0 && in % 8 == 0 && aligned16(hidden) && aligned16(lm_head);
}

int64_t fused_logprob_scratch_floats(int64_t n, int64_t vocab) {
  const int64_t tiles_n = (vocab + kTileCols - 1) / kTileCols;
  return n * (4 * tiles_n + 1);
}

void fused_token_logprobs(cudaStream_t s, float* out, float* entropy, const bf16* hidden, const bf16* lm_head,
                          const int32_t* targets, int64_t n, int64_t in, int64_t vocab, float* scratch) {
  if (n == 0) return;
  RT_CHECK(fused_logprobs_fit(hidden, lm_head, in) && aligned16(scratch) && vocab > 0, "fused LM head: in = ", in,
           " must be a positive multiple of 8, vocab = ", vocab, " positive, and the operands 16-byte aligned");
  const int64_t tiles_n = (vocab + kTileCols - 1) / kTileCols;
  RT_CHECK(tiles_n < INT32_MAX, "fused LM head: vocab ", vocab, " is too large");
  float4* partials = reinterpret_cast<float4*>(scratch);
  float* target_logit = scratch + 4 * n * tiles_n;
  const bool coop = cooperative_schedule();
  Maps maps;
  maps.a = attention::cuda::matrix_map(hidden, n, in, in, a_box_rows(coop), "hidden");
  maps.b0 = attention::cuda::matrix_map(lm_head, vocab, in, in, kTileCols, "lm_head");
  maps.b1 = maps.b0;
  const int tn = static_cast<int>(tiles_n);
  const unsigned blocks = static_cast<unsigned>((n + kCombineThreads / 32 - 1) / (kCombineThreads / 32));
  if (entropy) {
    launch(coop, s, maps, LogprobEpilogue<true>{partials, target_logit, targets, n, vocab, tn}, n, tiles_n, in, "LM head");
    combine_logprob_partials<true>
        <<<blocks, kCombineThreads, 0, s>>>(out, entropy, partials, target_logit, targets, n, tn);
  } else {
    launch(coop, s, maps, LogprobEpilogue<false>{partials, target_logit, targets, n, vocab, tn}, n, tiles_n, in, "LM head");
    combine_logprob_partials<false>
        <<<blocks, kCombineThreads, 0, s>>>(out, entropy, partials, target_logit, targets, n, tn);
  }
  RT_CUDA_CHECK_LAUNCH("combine_logprob_partials rows=", n, " tiles=", tiles_n);
}

}  // namespace ringtrain::model::cuda
