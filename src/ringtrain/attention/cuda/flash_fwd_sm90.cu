// The `flash` forward on Hopper: wgmma tensor cores in the FlashAttention-3 structure, without a producer warp.
// One CTA of two warpgroups per (query tile of 128 rows, query head, sequence); each warpgroup owns 64 rows, keeps
// its O and its scores in registers, and reads Q, K and V from swizzled shared tiles (wgmma.cuh). K and V tiles of
// 128 keys are double-buffered through cp.async, one tile ahead. Within a warpgroup the score GEMM of tile n and
// the P V GEMM of tile n - 1 run on the tensor cores while the softmax of tile n runs on the other units.
// Online softmax in the log2 domain; O is rescaled after each P V and normalised once at the end.
#include "ringtrain/attention/cuda/cuda_util.h"
#include "ringtrain/attention/cuda/flash_tile.cuh"
#include "ringtrain/attention/cuda/wgmma.cuh"

namespace ringtrain::attention::cuda {
namespace {

using namespace tile;

template <int D>
struct FwdSm90Config {
  static constexpr int kThreads = 256, BM = 128, BN = 128;
  static constexpr int kTileQ = BM * D * 2, kTileKV = BN * D * 2;
  static constexpr int kSmemBytes = kTileQ + 4 * kTileKV + 1024;  // Q, K x 2, V x 2, 1024-byte alignment slack
};

template <typename T, int D>
__global__ void __launch_bounds__(256, 1) flash_fwd_sm90_kernel(FlashFwdCall c) {
  using Cfg = FwdSm90Config<D>;
  constexpr int BM = Cfg::BM, BN = Cfg::BN;
  extern __shared__ unsigned char smem[];
  const uint32_t sQ = (smem_u32(smem) + 1023) & ~1023u, sK0 = sQ + Cfg::kTileQ, sV0 = sK0 + 2 * Cfg::kTileKV;

  const FlashShape& s = c.s;
  const int b = blockIdx.z, h = blockIdx.y, hk = h / (s.heads_q / s.heads_kv);
  const int m0 = (gridDim.x - 1 - blockIdx.x) * BM;  // the longest causal tiles start first
  const Seq seq = seq_of(s, b);
  if (m0 >= seq.sq) return;
  const int tid = threadIdx.x, wgi = tid / 128, warp = (tid % 128) / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int rows_valid = min(BM, seq.sq - m0);
  const int n_tiles = (key_limit(s, seq, m0 + rows_valid - 1) + BN - 1) / BN;  // key tiles any row sees
  const int row0 = m0 + wgi * 64 + warp * 16 + g;                               // this thread's rows: row0, row0 + 8

  const uint16_t* gq = static_cast<const uint16_t*>(c.q.ptr) + row_off(c.q, b, seq.q_row0 + m0, h);
  const uint16_t* gk = static_cast<const uint16_t*>(c.k.ptr) + row_off(c.k, b, seq.kv_row0, hk);
  const uint16_t* gv = static_cast<const uint16_t*>(c.v.ptr) + row_off(c.v, b, seq.kv_row0, hk);
  auto load_kv = [&](uint32_t dst, const uint16_t* src, int64_t stride, int nb) {
    wg::load_panels<BN, D, Cfg::kThreads>(dst, src + int64_t(nb) * BN * stride, stride, seq.skv - nb * BN, tid);
  };
  auto k_buf = [&](int nb) { return sK0 + (nb & 1) * Cfg::kTileKV; };
  auto v_buf = [&](int nb) { return sV0 + (nb & 1) * Cfg::kTileKV; };

  float o[D / 2], sc[BN / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};
  uint32_t p[BN / 16][4];  // P of the previous tile, 16-bit, register-A layout
  const float scale_log2 = s.scale * kLog2e;

  // sc = Q K_nb^T for this warpgroup's 64 rows.
  auto issue_qk = [&](int nb) {
    wg::fence();
#pragma unroll
    for (int k = 0; k < D / 16; ++k)
      wg::Mma<T, BN>::template ss<0, 0>(sc, wg::desc_k(sQ, BM, wgi * 64, k), wg::desc_k(k_buf(nb), BN, 0, k), k > 0);
    wg::commit();
  };
  // o += P V_nb
  auto issue_pv = [&](int nb) {
    wg::fence();
#pragma unroll
    for (int k = 0; k < BN / 16; ++k) wg::Mma<T, D>::template rs<1>(o, p[k], wg::desc_mn(v_buf(nb), BN, k, 0), 1);
    wg::commit();
  };
  // Masks and exponentiates sc (tile nb) into pn, updating the running max and sum; alpha rescales what O held.
  auto softmax = [&](int nb, uint32_t (&pn)[BN / 16][4], float (&alpha)[2]) {
    const int n0 = nb * BN;
    // Only tiles that reach past the sequence end or a row's causal limit pay for the mask.
    if (n0 + BN > seq.skv || (s.mask != kMaskNone && n0 + BN > m0 + 1 + seq.shift)) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int lim = key_limit(s, seq, row0 + 8 * half) - n0;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            if (8 * j + 2 * t + e >= lim) sc[4 * j + 2 * half + e] = -INFINITY;
      }
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float mx = row_max[half];
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) mx = fmaxf(mx, fmaxf(sc[4 * j + 2 * half], sc[4 * j + 2 * half + 1]));
      mx = quad_max(mx);
      // A row that has seen no finite score yet keeps max -inf; use 0 so that exp2 gives 0, not NaN.
      const float m_use = mx == -INFINITY ? 0.f : mx * scale_log2;
      alpha[half] = exp2f(row_max[half] * scale_log2 - m_use);
      row_max[half] = mx;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = sc[4 * j + 2 * half + e];
          x = exp2_approx(x * scale_log2 - m_use);
          sum += x;
        }
      }
      row_sum[half] = row_sum[half] * alpha[half] + sum;
    }
    wg::acc_to_a<T, BN>(sc, pn);
  };

  if (n_tiles > 0) {
    wg::load_panels<BM, D, Cfg::kThreads>(sQ, gq, c.q.row_stride, rows_valid, tid);
    load_kv(k_buf(0), gk, c.k.row_stride, 0);
    cp_async_commit();
    load_kv(v_buf(0), gv, c.v.row_stride, 0);
    cp_async_commit();
    wg::cp_async_wait<1>();
    wg::fence_async_smem();
    __syncthreads();  // Q and K_0 visible
    issue_qk(0);
    if (n_tiles > 1) {
      load_kv(k_buf(1), gk, c.k.row_stride, 1);
      cp_async_commit();
    }
    wg::wait<0>();
    wg::keep(sc);
    float alpha[2];
    softmax(0, p, alpha);  // O is still zero: nothing to rescale
  }
  for (int nb = 1; nb < n_tiles; ++nb) {
    wg::cp_async_wait<0>();
    wg::fence_async_smem();
    __syncthreads();  // K_nb and V_{nb-1} visible; every warpgroup is done with K_{nb-1} and V_{nb-2}
    load_kv(v_buf(nb), gv, c.v.row_stride, nb);
    if (nb + 1 < n_tiles) load_kv(k_buf(nb + 1), gk, c.k.row_stride, nb + 1);
    cp_async_commit();
    issue_qk(nb);
    issue_pv(nb - 1);
    wg::wait<1>();
    wg::keep(sc);
    uint32_t pn[BN / 16][4];
    float alpha[2];
    softmax(nb, pn, alpha);
    wg::wait<0>();
    wg::keep(o);
    wg::keep(p);
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      o[4 * j] *= alpha[0];
      o[4 * j + 1] *= alpha[0];
      o[4 * j + 2] *= alpha[1];
      o[4 * j + 3] *= alpha[1];
    }
#pragma unroll
    for (int k = 0; k < BN / 16; ++k)
#pragma unroll
      for (int r = 0; r < 4; ++r) p[k][r] = pn[k][r];
  }
  if (n_tiles > 0) {
    wg::cp_async_wait<0>();
    wg::fence_async_smem();
    __syncthreads();  // the last V visible
    issue_pv(n_tiles - 1);
    wg::wait<0>();
    wg::keep(o);
    wg::keep(p);
  }

  // Epilogue: O = acc / l (0 for a row that saw no finite score), LSE = max * scale + ln(l) (-inf for such a row).
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + 8 * half;
    const float l = quad_sum(row_sum[half]);
    if (row >= seq.sq) continue;
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const int64_t ooff = row_off(c.o, b, seq.q_row0 + row, h) + 2 * t;
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
      store_pair<T>(c.o.ptr, c.o.elem, ooff + 8 * j, o[4 * j + 2 * half] * inv, o[4 * j + 2 * half + 1] * inv, false);
    if (t == 0)
      c.lse.ptr[stat_off(c.lse, b, seq.q_row0 + row, h)] =
          l > 0.f ? (row_max[half] * scale_log2 + __log2f(l)) * kLn2 : -INFINITY;
  }
}

template <typename T, int D>
void launch_fwd(const FlashFwdCall& c, cudaStream_t stream) {
  using Cfg = FwdSm90Config<D>;
  auto kernel = flash_fwd_sm90_kernel<T, D>;
  RT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes),
                cat("flash: flash_fwd_sm90_kernel<D=", D, ">: setting ", Cfg::kSmemBytes, " bytes of shared memory"));
  const dim3 grid((c.s.seqlen_q + Cfg::BM - 1) / Cfg::BM, c.s.heads_q, c.s.batch);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(c);
  RT_CUDA_CHECK(cudaGetLastError(), cat("flash: launching flash_fwd_sm90_kernel<D=", D, "> grid (", grid.x, ", ",
                                        grid.y, ", ", grid.z, ")", flash_shape_str(c.s)));
}

}  // namespace

void flash_forward(const FlashFwdCall& c, cudaStream_t stream) {
  if (c.s.seqlen_q == 0) return;
  const bool d64 = c.s.head_dim == 64;
  if (c.s.bf16) d64 ? launch_fwd<__nv_bfloat16, 64>(c, stream) : launch_fwd<__nv_bfloat16, 128>(c, stream);
  else d64 ? launch_fwd<__half, 64>(c, stream) : launch_fwd<__half, 128>(c, stream);
}

}  // namespace ringtrain::attention::cuda
