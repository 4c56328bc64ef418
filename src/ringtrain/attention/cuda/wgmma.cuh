// Hopper (sm_90a) building blocks of the flash kernels (flash_fwd_sm90.cu, flash_bwd_sm90.cu): warpgroup MMA
// (wgmma) on shared-memory descriptors, the 128-byte-swizzled "panel" tiles those descriptors read, and the
// fences, barriers and bulk reductions around them.
//
// Panel tile: a [ROWS][C] tile of 16-bit values is stored as C / 64 panels, each [ROWS][64] with 128-byte rows
// whose 16-byte chunks are XORed with row % 8 (the SW128 pattern wgmma decodes from address bits, so every tile
// starts 1024-byte aligned). Read with the contiguous dimension as
//  - K (K-major): an operand [M or N][K]; a 16-wide k step is panel k / 4, byte offset 32 * (k % 4);
//  - M or N (MN-major, transposed): an operand [K][MN]; LBO = the panel stride, SBO = 8 rows = 1024 bytes.
// Accumulator and register-A layouts per warp of the warpgroup (warp w owns rows 16w..16w+15) are those of
// mma.m16n8k16 (flash_tile.cuh), repeated over the N / 8 column groups: d[4j + 2h + e] = (row g + 8h, 8j + 2t + e).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "ringtrain/attention/cuda/flash_tile.cuh"

namespace ringtrain::attention::cuda::wg {

constexpr int kPanel = 64;  // 16-bit values per swizzled row

// Byte offset of element (row, col) (col even for a 4-byte pair) in a panel tile of `rows` rows.
__device__ __forceinline__ uint32_t panel_off(int rows, int row, int col) {
  return static_cast<uint32_t>((col / kPanel) * rows * 128 + row * 128 + ((((col % kPanel) / 8) ^ (row & 7)) << 4) +
                               (col % 8) * 2);
}

// cp.async of a [ROWS][C] tile into a panel tile by the producer warp's 32 lanes, rows >= rows_valid zero-filled.
// A loop, not unrolled: the producer runs on few registers.
template <int ROWS, int C>
__device__ __forceinline__ void load_panels_by_warp(uint32_t dst, const uint16_t* g, int64_t row_stride,
                                                    int rows_valid, int lane) {
  constexpr int kChunks = C / 8;
#pragma unroll 1
  for (int i = lane; i < ROWS * kChunks; i += 32) {
    const int r = i / kChunks, col = (i % kChunks) * 8;
    const bool ok = r < rows_valid;
    tile::cp_async16(dst + panel_off(ROWS, r, col), ok ? g + r * row_stride + col : g, ok);
  }
}

// Shared-memory matrix descriptor, 128-byte swizzle.
__device__ __forceinline__ uint64_t desc(uint32_t saddr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return static_cast<uint64_t>((saddr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(lbo_bytes >> 4) << 16) |
         (static_cast<uint64_t>(sbo_bytes >> 4) << 32) | (uint64_t(1) << 62);
}
// The descriptor `d` with its start address moved by `bytes`. The add is opaque so that the compiler keeps one base
// descriptor live instead of hoisting a descriptor per k step out of the loops (which made the backward spill).
__device__ __forceinline__ uint64_t desc_at(uint64_t d, uint32_t bytes) {
  uint64_t r;
  asm volatile("add.s64 %0, %1, %2;\n" : "=l"(r) : "l"(d), "l"(static_cast<uint64_t>(bytes >> 4)));
  return r;
}
// K-major operand: rows [row0, row0 + 64 or N) of a panel tile of `rows` rows, 16-wide k step `k`.
__device__ __forceinline__ uint64_t desc_k(uint32_t tile, int rows, int row0, int k) {
  return desc_at(desc(tile + row0 * 128, 16, 1024), (k / 4) * rows * 128 + (k % 4) * 32);
}
// MN-major operand: K rows [16k, 16k + 16) of a panel tile of `rows` rows, MN columns from panel `panel0`.
__device__ __forceinline__ uint64_t desc_mn(uint32_t tile, int rows, int k, int panel0) {
  return desc_at(desc(tile + panel0 * rows * 128, rows * 128, 1024), k * 16 * 128);
}

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Ties registers an in-flight wgmma reads or writes to this point, so the compiler neither reuses nor reads them
// before the wait that precedes it.
template <int N>
__device__ __forceinline__ void keep(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void keep(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

// Makes this thread's generic shared-memory writes (st.shared, cp.async) visible to wgmma and bulk copies.
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Barrier over the `threads` threads that use id `id` (1..15; 0 is __syncthreads).
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// An m64nN accumulator as the N / 16 register-A fragments (16-bit) of a GEMM whose k runs over those N columns.
template <typename T, int N>
__device__ __forceinline__ void acc_to_a(const float (&c)[N / 2], uint32_t (&a)[N / 16][4]) {
#pragma unroll
  for (int k = 0; k < N / 16; ++k)
#pragma unroll
    for (int r = 0; r < 4; ++r) a[k][r] = tile::pack2<T>(c[8 * k + 2 * r], c[8 * k + 2 * r + 1]);
}

// D[64 x N] (+)= A[64 x 16] B[16 x N], fp32 accumulators. ss: A and B from descriptors (kTrans* = 1: MN-major);
// rs: A from registers (the register-A layout above), B from a descriptor. acc = 0 overwrites D.
template <typename T, int N>
struct Mma;

#define RT_WGMMA_MMA_N64(CTYPE, TY)                                                                                    \
template <>                                                                                                            \
struct Mma<CTYPE, 64> {                                                                                                \
  template <int kTransA, int kTransB>                                                                                  \
  static __device__ __forceinline__ void ss(float (&d)[32], uint64_t a, uint64_t b, int acc) {                         \
    asm volatile(                                                                                                      \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                                   \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " {"                                                   \
        "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"                                                       \
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, %35, %36;\n}\n"          \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),              \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),        \
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),      \
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])       \
        : "l"(a), "l"(b), "r"(acc), "n"(kTransA), "n"(kTransB));                                                       \
  }                                                                                                                    \
  template <int kTransB>                                                                                               \
  static __device__ __forceinline__ void rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b, int acc) {             \
    asm volatile(                                                                                                      \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                                   \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " {"                                                   \
        "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"                                                       \
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, %38;\n}\n" \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),              \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),        \
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),      \
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])       \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc), "n"(kTransB));                                 \
  }                                                                                                                    \
};                                                                                                                    

#define RT_WGMMA_MMA_N128(CTYPE, TY)                                                                                   \
template <>                                                                                                            \
struct Mma<CTYPE, 128> {                                                                                               \
  template <int kTransA, int kTransB>                                                                                  \
  static __device__ __forceinline__ void ss(float (&d)[64], uint64_t a, uint64_t b, int acc) {                         \
    asm volatile(                                                                                                      \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                                   \
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {"                                                  \
        "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"                                                       \
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"                                             \
        "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"                                             \
        "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, %67, %68;\n}\n"          \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),              \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),        \
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),      \
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),      \
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),      \
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),      \
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),      \
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])       \
        : "l"(a), "l"(b), "r"(acc), "n"(kTransA), "n"(kTransB));                                                       \
  }                                                                                                                    \
  template <int kTransB>                                                                                               \
  static __device__ __forceinline__ void rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b, int acc) {             \
    asm volatile(                                                                                                      \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                                                   \
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {"                                                  \
        "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"                                                       \
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"                                             \
        "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"                                             \
        "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, %70;\n}\n" \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),              \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),        \
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),      \
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),      \
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),      \
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),      \
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),      \
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])       \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc), "n"(kTransB));                                 \
  }                                                                                                                    \
};                                                                                                                    

RT_WGMMA_MMA_N64(__nv_bfloat16, "bf16")
RT_WGMMA_MMA_N128(__nv_bfloat16, "bf16")
RT_WGMMA_MMA_N64(__half, "f16")
RT_WGMMA_MMA_N128(__half, "f16")
#undef RT_WGMMA_MMA_N64
#undef RT_WGMMA_MMA_N128

// D[64 x N] += A[64 x 16] B[16 x N] for N = 64, 128, 192 or 256: A from registers, B the 16-row step `k` of an
// MN-major panel tile of `rows` rows. Above 128 columns as m64n128 products over pairs of B's panels and, at 192, an
// m64n64 over the last one, which leave D in the m64nN accumulator layout.
template <typename T, int N>
__device__ __forceinline__ void mma_rs_wide(float (&d)[N / 2], const uint32_t (&a)[4], uint32_t tile, int rows,
                                            int k) {
  static_assert(N % 64 == 0 && N <= 256, "N is a whole number of 64-column panels, at most four");
  if constexpr (N <= 128) {
    Mma<T, N>::template rs<1>(d, a, desc_mn(tile, rows, k, 0), 1);
  } else {
#pragma unroll
    for (int p = 0; p + 2 <= N / 64; p += 2)
      Mma<T, 128>::template rs<1>(*reinterpret_cast<float(*)[64]>(d + 32 * p), a, desc_mn(tile, rows, k, p), 1);
    if constexpr (N % 128 != 0)
      Mma<T, 64>::template rs<1>(*reinterpret_cast<float(*)[32]>(d + N / 2 - 32), a,
                                 desc_mn(tile, rows, k, N / 64 - 1), 1);
  }
}

}  // namespace ringtrain::attention::cuda::wg
