// Tile helpers of the mma.sync tensor-core kernels (`efficient` for 16-bit inputs, flash's deterministic backward),
// and the softmax and sequence helpers the Hopper flash kernels share with them: their two variants, async
// global->shared copies, swizzled shared tiles, ldmatrix and the m16n8k16 tensor-core MMA, fragment conversions,
// and the per-call sequence geometry.
//
// Fragment layouts (PTX ISA, mma.m16n8k16, lane = 4 * g + t):
//   A 16x16: a0 (row g, k 2t..2t+1), a1 (row g+8, same k), a2 (row g, k 2t+8..), a3 (row g+8, k 2t+8..)
//   B 16x8:  b0 (k 2t..2t+1, col g), b1 (k 2t+8..2t+9, col g)
//   C 16x8:  c0,c1 (row g, cols 2t, 2t+1), c2,c3 (row g+8, cols 2t, 2t+1)
// A C tile pair (cols 0-7, 8-15) converted to 16-bit is exactly an A fragment over k = those 16 columns.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "ringtrain/attention/cuda/efficient_kernels.h"

namespace ringtrain::attention::cuda::tile {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// The two users of the mma.sync kernels (flash_fwd.cu, flash_bwd.cu; flash only for its deterministic backward) as
// compile-time variants. A feature a variant lacks is cut by `if constexpr` (or folds to a constant).
//  kPadHeadDim: head_dim is any multiple of 8 up to the tile width D. Columns >= head_dim are zero-filled in shared
//    memory, so they add nothing to any product, and are never stored.
//  kBias: the kernel carries the additive-bias code (EffBias; a null ptr skips it at run time, one uniform branch).
//    The bias is added to the raw scores as bias / scale so that the no-bias arithmetic is unchanged and -inf
//    entries stay -inf; a row whose visible scores are all -inf ends with l = 0 (O = 0, LSE = -inf). Indices into
//    it are int64 (a 131072 x 131072 bias has 2^34 entries per head). The efficient forward picks the no-bias
//    instantiation when there is none (it spills less at D = 128); its backward always runs the bias one (ptxas -v:
//    a separate no-bias backward spilled more, not less).
struct FlashVariant {
  using FwdCall = FlashFwdCall;
  using BwdCall = FlashBwdCall;
  static constexpr bool kPadHeadDim = false, kBias = false;
  static constexpr const char* kBackend = "flash";
};
template <bool kWithBias>
struct EfficientVariant {
  using FwdCall = EffFwdCall;
  using BwdCall = EffBwdCall;
  static constexpr bool kPadHeadDim = true, kBias = kWithBias;
  static constexpr const char* kBackend = "efficient";
};

// Offset of bias row (b, h, i); add j * col_stride for key j. (Also read by the efficient SIMT kernels.)
__device__ __forceinline__ int64_t bias_row_off(const EffBias& bias, int b, int h, int64_t i) {
  return b * bias.batch_stride + h * bias.head_stride + i * bias.row_stride;
}

__device__ __forceinline__ float load_bias(const EffBias& bias, int64_t off) {
  switch (bias.elem) {
    case BiasElem::BF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(bias.ptr)[off]);
    case BiasElem::F16: return __half2float(static_cast<const __half*>(bias.ptr)[off]);
    case BiasElem::F64: return static_cast<float>(static_cast<const double*>(bias.ptr)[off]);
    default: return static_cast<const float*>(bias.ptr)[off];
  }
}

// Bias entry (b, h, row, key) in raw-score units: added before the softmax scale, it leaves the no-bias arithmetic
// unchanged and keeps -inf entries -inf.
__device__ __forceinline__ float bias_score(const EffBias& bias, int b, int h, int row, int key, float inv_scale) {
  return load_bias(bias, bias_row_off(bias, b, h, row) + key * bias.col_stride) * inv_scale;
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global->shared copy; when !valid nothing is read and the 16 bytes are zero-filled.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
// 4-byte variant (LSE / D rows).
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }

// Byte offset of 16-byte chunk `chunk` of row `row` in a row-major tile of COLS 16-bit values. The chunk index
// is XORed with row % 8 so that the 8 rows read by one ldmatrix land in 8 different bank groups.
template <int COLS>
__device__ __forceinline__ uint32_t swz(int row, int chunk) {
  static_assert(COLS % 64 == 0, "tile rows must be a multiple of 128 bytes");
  return static_cast<uint32_t>(row * COLS * 2 + ((chunk ^ (row & 7)) << 4));
}

// Copies rows [0, ROWS) x COLS of a 16-bit global tile (row stride in elements) into a swizzled shared tile;
// rows >= rows_valid and 16-byte chunks >= chunks_valid (a zero-padded head dim) become zeros. A full-width caller
// passes the constant COLS / 8, which folds the chunk test away.
template <int ROWS, int COLS, int NTHREADS>
__device__ __forceinline__ void load_tile(uint32_t sdst, const uint16_t* g, int64_t row_stride, int rows_valid,
                                          int chunks_valid) {
  constexpr int kChunks = COLS / 8;
  static_assert((ROWS * kChunks) % NTHREADS == 0, "tile copy must split evenly over the threads");
#pragma unroll
  for (int i = 0; i < ROWS * kChunks / NTHREADS; ++i) {
    const int idx = i * NTHREADS + static_cast<int>(threadIdx.x);
    const int r = idx / kChunks, c = idx % kChunks;
    const bool ok = r < rows_valid && c < chunks_valid;
    cp_async16(sdst + swz<COLS>(r, c), ok ? g + r * row_stride + c * 8 : g, ok);
  }
}

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// The four ldmatrix address patterns, for a 16x16 block at (row0, col0) of a swizzled tile (col0 % 16 == 0):
// A operand from a [m][k] tile.
template <int COLS>
__device__ __forceinline__ uint32_t a_addr(uint32_t base, int row0, int col0, int lane) {
  return base + swz<COLS>(row0 + (lane & 15), (col0 >> 3) + (lane >> 4));
}
// Two B operands (n tiles row0..+7 and row0+8..+15) from a [n][k] tile: r0,r1 = first, r2,r3 = second.
template <int COLS>
__device__ __forceinline__ uint32_t bt_addr(uint32_t base, int row0, int col0, int lane) {
  return base + swz<COLS>(row0 + (lane & 7) + ((lane >> 4) << 3), (col0 >> 3) + ((lane >> 3) & 1));
}
// Two B operands (n tiles col0..+7 and col0+8..+15) from a [k][n] tile, with ldsm_x4_trans.
template <int COLS>
__device__ __forceinline__ uint32_t b_addr_trans(uint32_t base, int row0, int col0, int lane) {
  return base + swz<COLS>(row0 + (lane & 7) + (((lane >> 3) & 1) << 3), (col0 >> 3) + (lane >> 4));
}
// A operand from a [k][m] tile (the transpose is read), with ldsm_x4_trans.
template <int COLS>
__device__ __forceinline__ uint32_t a_addr_trans(uint32_t base, int row0, int col0, int lane) {
  return base + swz<COLS>(row0 + (lane & 7) + ((lane >> 4) << 3), (col0 >> 3) + ((lane >> 3) & 1));
}

template <typename T>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void mma<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma<__half>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as a packed pair of 16-bit values (lo in the low half).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// The A fragment over k = 16 columns held as two C tiles (cols 0-7 in c0, 8-15 in c1).
template <typename T>
__device__ __forceinline__ void c_to_a(const float (&c0)[4], const float (&c1)[4], uint32_t (&a)[4]) {
  a[0] = pack2<T>(c0[0], c0[1]);
  a[1] = pack2<T>(c0[2], c0[3]);
  a[2] = pack2<T>(c1[0], c1[1]);
  a[3] = pack2<T>(c1[2], c1[3]);
}

// 2^x in one MUFU instruction (exp2f adds range handling around it); results below 2^-126 flush to 0, which a
// softmax weight never misses.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// The LSE of a row in the log2 domain; a row that saw no key (LSE = -inf) gets +inf so that P = exp2(x - inf) = 0.
__device__ __forceinline__ float lse_log2(float lse) { return lse == -INFINITY ? INFINITY : lse * kLog2e; }

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Stores (or adds, when accumulate; fp32 only) two adjacent output values.
template <typename T>
__device__ __forceinline__ void store_pair(void* base, FlashElem elem, int64_t off, float a, float b, bool accumulate) {
  if (elem == FlashElem::F32) {
    float2* p = reinterpret_cast<float2*>(static_cast<float*>(base) + off);
    if (accumulate) {
      const float2 old = *p;
      a += old.x;
      b += old.y;
    }
    *p = make_float2(a, b);
  } else {
    *reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(base) + off) = pack2<T>(a, b);
  }
}

// One sequence of a call: its first row in the q-side and kv-side tensors and its lengths.
struct Seq {
  int64_t q_row0, kv_row0;  // packed: offsets into the T dimension; BSHD: 0
  int sq, skv;
  int shift;  // key_limit(i) = i + 1 + shift for causal masks
};

__device__ __forceinline__ Seq seq_of(const FlashShape& s, int b) {
  Seq q;
  if (s.cu_q) {
    q.q_row0 = s.cu_q[b];
    q.kv_row0 = s.cu_kv[b];
    q.sq = s.cu_q[b + 1] - s.cu_q[b];
    q.skv = s.cu_kv[b + 1] - s.cu_kv[b];
  } else {
    q.q_row0 = q.kv_row0 = 0;
    q.sq = s.seqlen_q;
    q.skv = s.seqlen_kv;
  }
  q.shift = s.mask == kMaskCausalBottomRight ? q.skv - q.sq : 0;
  return q;
}

// Keys [0, key_limit) are visible to query row i.
__device__ __forceinline__ int key_limit(const FlashShape& s, const Seq& q, int i) {
  if (s.mask == kMaskNone) return q.skv;
  return max(0, min(q.skv, i + 1 + q.shift));
}

// Under a sliding window row i sees keys [key_start, key_limit) (params.h's key_start): no key before the unclamped
// causal limit minus the window. 0 without a window.
__device__ __forceinline__ int key_start(const FlashShape& s, const Seq& q, int i) {
  if (s.window <= 0 || s.mask == kMaskNone) return 0;
  const int64_t start = int64_t(i) + 1 + q.shift - s.window;
  return static_cast<int>(max(int64_t{0}, min(int64_t(q.skv), start)));
}

// Query tiles of BM rows whose rows may see a key of [n0, n1): tiles [first, end). Causal rows see key n0 from row
// n0 - shift on; under a window, no row after n1 - 2 + window - shift sees key n1 - 1.
struct TileRange {
  int first, end;
};
__device__ __forceinline__ TileRange query_tiles(const FlashShape& s, const Seq& q, int n0, int n1, int bm) {
  TileRange r{s.mask != kMaskNone ? max(0, n0 - q.shift) / bm : 0, (q.sq + bm - 1) / bm};
  if (s.window > 0 && s.mask != kMaskNone) {
    const int64_t last_row = int64_t(n1) - 2 + s.window - q.shift;
    r.end = last_row < 0 ? 0 : static_cast<int>(min(int64_t(r.end), last_row / bm + 1));
  }
  return r;
}

// Element offset of (row, head) of one batch entry.
__device__ __forceinline__ int64_t row_off(const FlashRows& t, int b, int64_t row, int head) {
  return b * t.batch_stride + row * t.row_stride + head * t.head_stride;
}
__device__ __forceinline__ int64_t stat_off(const FlashStats& t, int b, int64_t row, int head) {
  return b * t.batch_stride + row * t.row_stride + head * t.head_stride;
}

}  // namespace ringtrain::attention::cuda::tile
