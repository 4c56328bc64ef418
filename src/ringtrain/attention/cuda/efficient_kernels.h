// The `efficient` GPU kernels' view of one attention call: plain data shared by the host code
// (efficient_backend.cpp) and the kernels. Rows, stats and sequence geometry are described exactly like the flash
// kernels' (flash_kernels.h); the additions are the additive bias and the real (unpadded) head dimension.
//
// Two kernel families serve the calls:
//  - tensor cores: bf16/fp16, head dim <= 128, rows 16-byte aligned. These are the flash kernels themselves
//    (flash_fwd.cu, flash_bwd.cu) in their `efficient` variant (flash_tile.cuh): head dim zero-padded to 64 or 128
//    in shared memory, and the bias added to the scores.
//  - SIMT (efficient_simt.cu): everything else, i.e. fp32 (exact fp32 FMAs, no TF32), head dims 136..256 and
//    rows that are not 16-byte aligned. 32x32 tiles in fp32 shared memory; the backward runs as two kernels
//    (dK/dV per key tile, dQ per query tile), so it is always deterministic.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ringtrain/attention/cuda/flash_kernels.h"

namespace ringtrain::attention::cuda {

enum class BiasElem : int { F32, BF16, F16, F64 };

// Element (b, h, i, j) of the bias is at ptr + b*batch_stride + h*head_stride + i*row_stride + j*col_stride
// (stride 0 broadcasts). ptr == nullptr: no bias.
struct EffBias {
  const void* ptr = nullptr;
  BiasElem elem = BiasElem::F32;
  int64_t batch_stride = 0, head_stride = 0, row_stride = 0, col_stride = 0;
};

struct EffFwdCall {
  FlashShape s;  // s.head_dim is the real head dim (a multiple of 8, <= 256); s.bf16 selects bf16 vs fp16
  FlashRows q, k, v, o;  // q/k/v in the call's dtype; o in that dtype or fp32
  FlashStats lse;
  EffBias bias;
  FlashElem elem = FlashElem::BF16;  // q/k/v/dout dtype (F32 only on the SIMT path)
};

struct EffBwdCall {
  FlashShape s;
  FlashRows q, k, v, o, dout, dq, dk, dv;  // dout in the call's dtype; o any; dq/dk/dv the call's dtype or fp32
  FlashStats lse;
  EffBias bias;
  FlashElem elem = FlashElem::BF16;
  bool accumulate = false;  // add into dq/dk/dv (fp32)
  bool deterministic = false;
};

// Each throws ringtrain::Error naming the kernel and the shape when a launch fails.
void efficient_forward_tc(const EffFwdCall& c, cudaStream_t stream);   // flash_fwd.cu
void efficient_backward_tc(const EffBwdCall& c, cudaStream_t stream);  // flash_bwd.cu
void efficient_forward_simt(const EffFwdCall& c, cudaStream_t stream);
void efficient_backward_simt(const EffBwdCall& c, cudaStream_t stream);
// delta = rowsum(dO * O) per (row, head), LSE-shaped fp32 (the first step of every backward; flash_bwd.cu).
void efficient_delta(const EffBwdCall& c, const FlashStats& delta, cudaStream_t stream);

}  // namespace ringtrain::attention::cuda
