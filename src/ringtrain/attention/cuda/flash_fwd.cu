// Tensor-core forward of `efficient` for 16-bit inputs (flash_tile.cuh: the variants): FlashAttention-2 structure
// on mma.sync tensor cores. (flash's own forward is the Hopper kernel of flash_fwd_sm90.cu.)
// One CTA per (query tile of BM rows, query head, sequence); each warp owns MT 16-row slices of the tile. K and V
// tiles of BN keys stream through shared memory with cp.async: V_n loads while S = Q K_n^T is computed, K_{n+1}
// while the softmax and O += P V_n run. Online softmax in the log2 domain; O is rescaled once at the end. Key tiles
// past the tile's last causal limit or wholly before its first row's sliding-window start are never loaded.
#include "ringtrain/attention/cuda/cuda_util.h"
#include "ringtrain/attention/cuda/flash_tile.cuh"

namespace ringtrain::attention::cuda {
namespace {

using namespace tile;

template <int D, int kWarps, int MT, int BN>
struct FwdConfig {
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int BM = 16 * MT * kWarps;
  static constexpr int kSmemBytes = (BM + 2 * BN) * D * 2;
};

// D: the tile width (the head dim, or what V pads it to).
template <typename V, typename T, int D, int kWarps, int MT, int BN>
__global__ void __launch_bounds__(32 * kWarps, 1) flash_fwd_kernel(typename V::FwdCall c) {
  using Cfg = FwdConfig<D, kWarps, MT, BN>;
  constexpr int BM = Cfg::BM, kThreads = Cfg::kThreads;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sQ = smem_u32(smem), sK = sQ + BM * D * 2, sV = sK + BN * D * 2;

  const FlashShape& s = c.s;
  const int b = blockIdx.z, h = blockIdx.y, hk = h / (s.heads_q / s.heads_kv);
  const int m0 = (gridDim.x - 1 - blockIdx.x) * BM;  // the longest causal tiles start first
  const Seq seq = seq_of(s, b);
  if (m0 >= seq.sq) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int rows_valid = min(BM, seq.sq - m0);
  const int chunks = V::kPadHeadDim ? s.head_dim / 8 : D / 8;  // 16-byte chunks of a row that hold data
  const float inv_scale = 1.f / s.scale;  // the bias in raw-score units

  // Key tiles any row of the tile may see: [nb_first, n_tiles) (limits and window starts grow with the row).
  const int n_end = key_limit(s, seq, m0 + rows_valid - 1);
  const int n_tiles = (n_end + BN - 1) / BN, nb_first = key_start(s, seq, m0) / BN;
  // The tile's last row has the latest window start: key tiles beginning before it need the window mask.
  const int n_win = key_start(s, seq, m0 + rows_valid - 1);

  const uint16_t* gq = static_cast<const uint16_t*>(c.q.ptr) + row_off(c.q, b, seq.q_row0 + m0, h);
  const uint16_t* gk = static_cast<const uint16_t*>(c.k.ptr) + row_off(c.k, b, seq.kv_row0, hk);
  const uint16_t* gv = static_cast<const uint16_t*>(c.v.ptr) + row_off(c.v, b, seq.kv_row0, hk);

  float o[MT][D / 8][4] = {};
  float row_max[MT][2], row_sum[MT][2] = {};
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) row_max[mt][0] = row_max[mt][1] = -INFINITY;
  const float scale_log2 = s.scale * kLog2e;

  if (n_tiles > nb_first) {
    load_tile<BM, D, kThreads>(sQ, gq, c.q.row_stride, rows_valid, chunks);
    load_tile<BN, D, kThreads>(sK, gk + int64_t(nb_first) * BN * c.k.row_stride, c.k.row_stride,
                               seq.skv - nb_first * BN, chunks);
    cp_async_commit();
  }
  for (int nb = nb_first; nb < n_tiles; ++nb) {
    const int n0 = nb * BN;
    cp_async_wait_all();
    __syncthreads();  // K_n visible; every warp is done with V_{n-1}
    load_tile<BN, D, kThreads>(sV, gv + int64_t(n0) * c.v.row_stride, c.v.row_stride, seq.skv - n0, chunks);
    cp_async_commit();

    float sc[MT][BN / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) ldsm_x4(a_addr<D>(sQ, (warp * MT + mt) * 16, kk * 16, lane), a[mt]);
#pragma unroll
      for (int np = 0; np < BN / 16; ++np) {
        uint32_t bk[4];
        ldsm_x4(bt_addr<D>(sK, np * 16, kk * 16, lane), bk);
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
      load_tile<BN, D, kThreads>(sK, gk + int64_t(n0 + BN) * c.k.row_stride, c.k.row_stride, seq.skv - n0 - BN,
                                 chunks);
      cp_async_commit();
    }

    // Bias (rows and keys in range), then mask keys past the sequence end, past a row's causal limit or before its
    // window start (only tiles that reach them).
    const bool need_mask =
        n0 + BN > seq.skv || (s.mask != kMaskNone && n0 + BN > m0 + 1 + seq.shift) || n0 < n_win;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = m0 + (warp * MT + mt) * 16 + g + 8 * half;
        if constexpr (V::kBias) {
          if (c.bias.ptr && row < seq.sq) {
#pragma unroll
            for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const int key = n0 + nt * 8 + 2 * t + e;
                if (key < seq.skv) sc[mt][nt][2 * half + e] += bias_score(c.bias, b, h, row, key, inv_scale);
              }
            }
          }
        }
        const int lim = need_mask ? key_limit(s, seq, row) : seq.skv;
        const int first = need_mask ? key_start(s, seq, row) : 0;
        float mx = row_max[mt][half];
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& x = sc[mt][nt][2 * half + e];
            const int key = n0 + nt * 8 + 2 * t + e;
            if (need_mask && (key >= lim || key < first)) x = -INFINITY;
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
        for (int dt = 0; dt < D / 8; ++dt) {
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
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t bv[4];
        ldsm_x4_trans(b_addr_trans<D>(sV, kk * 16, dp * 16, lane), bv);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma<T>(o[mt][2 * dp], a[mt], bv[0], bv[1]);
          mma<T>(o[mt][2 * dp + 1], a[mt], bv[2], bv[3]);
        }
      }
    }
  }

  // Epilogue: O = acc / l (0 for a row that saw no finite score), LSE = max * scale + ln(l) (-inf for such a row).
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
      for (int dt = 0; dt < D / 8; ++dt)
        if (dt < chunks)
          store_pair<T>(c.o.ptr, c.o.elem, ooff + dt * 8 + 2 * t, o[mt][dt][2 * half] * inv,
                        o[mt][dt][2 * half + 1] * inv, false);
      if (t == 0)
        c.lse.ptr[stat_off(c.lse, b, seq.q_row0 + row, h)] =
            l > 0.f ? (row_max[mt][half] * scale_log2 + __log2f(l)) * kLn2 : -INFINITY;
    }
  }
}

template <typename V, typename T, int D>
void launch_fwd(const typename V::FwdCall& c, cudaStream_t stream) {
  constexpr int kWarps = 4, MT = 2, BN = 64;
  using Cfg = FwdConfig<D, kWarps, MT, BN>;
  auto kernel = flash_fwd_kernel<V, T, D, kWarps, MT, BN>;
  if (Cfg::kSmemBytes > 48 * 1024)
    RT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes),
                  cat(V::kBackend, ": flash_fwd_kernel<D=", D, ">: setting ", Cfg::kSmemBytes,
                      " bytes of shared memory"));
  const dim3 grid((c.s.seqlen_q + Cfg::BM - 1) / Cfg::BM, c.s.heads_q, c.s.batch);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(c);
  RT_CUDA_CHECK(cudaGetLastError(), cat(V::kBackend, ": launching flash_fwd_kernel<D=", D, "> grid (", grid.x, ", ",
                                        grid.y, ", ", grid.z, ")", flash_shape_str(c.s)));
}

template <typename V>
void forward(const typename V::FwdCall& c, cudaStream_t stream) {
  if (c.s.seqlen_q == 0) return;
  // The tile width: the padded head dim (<= 128).
  const bool d64 = c.s.head_dim <= 64;
  if (c.s.bf16) d64 ? launch_fwd<V, __nv_bfloat16, 64>(c, stream) : launch_fwd<V, __nv_bfloat16, 128>(c, stream);
  else d64 ? launch_fwd<V, __half, 64>(c, stream) : launch_fwd<V, __half, 128>(c, stream);
}

}  // namespace

// No bias: the instantiation without the bias code, which spills less at D = 128.
void efficient_forward_tc(const EffFwdCall& c, cudaStream_t stream) {
  if (c.bias.ptr) forward<EfficientVariant<true>>(c, stream);
  else forward<EfficientVariant<false>>(c, stream);
}

}  // namespace ringtrain::attention::cuda
