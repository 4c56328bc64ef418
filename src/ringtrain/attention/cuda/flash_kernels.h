// The `flash` GPU kernels' view of one attention call: plain data shared by the host code (flash_backend.cpp)
// and the kernels (flash_fwd_sm90.cu, flash_bwd_sm90.cu; flash_bwd.cu in deterministic mode). Strides are in
// elements; the head dimension has unit stride.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

namespace ringtrain::attention::cuda {

enum class FlashElem : int { BF16, F16, F32 };

// One [B, S, H, D] (BSHD, batch_stride used) or [T, H, D] (packed, batch_stride 0) tensor.
struct FlashRows {
  void* ptr = nullptr;
  FlashElem elem = FlashElem::BF16;
  int64_t batch_stride = 0, row_stride = 0, head_stride = 0;
};

// LSE-shaped fp32 data: [B, H, S] or packed [H, T] (batch_stride 0).
struct FlashStats {
  float* ptr = nullptr;
  int64_t batch_stride = 0, head_stride = 0, row_stride = 0;
};

enum FlashMask : int { kMaskNone = 0, kMaskCausalTopLeft = 1, kMaskCausalBottomRight = 2 };

struct FlashShape {
  int batch = 1, heads_q = 1, heads_kv = 1, head_dim = 64;
  int seqlen_q = 0, seqlen_kv = 0;           // packed: the longest sequence
  int64_t total_q = 0;                       // rows of the q-side tensors (packed: Tq; else B * Sq)
  int64_t total_kv = 0;                      // rows of the k/v-side tensors (packed: Tkv; else B * Skv)
  const int* cu_q = nullptr;                 // packed only: int32 [B + 1] on the device
  const int* cu_kv = nullptr;
  int mask = kMaskNone;
  int window = 0;                            // sliding window in keys (causal masks only; params.h); 0: none
  float scale = 1.f;                         // softmax scale
  bool bf16 = true;                          // else fp16
};

struct FlashFwdCall {
  FlashShape s;
  FlashRows q, k, v, o;  // o may be fp32
  FlashStats lse;
};

struct FlashBwdCall {
  FlashShape s;
  FlashRows q, k, v, o, dout, dq, dk, dv;  // o any float; dq/dk/dv fp32 when accumulate
  FlashStats lse;
  bool accumulate = false;
  bool deterministic = false;
};

// " for B=.. Hq=.. Hkv=.. D=.. Sq=.. Skv=..": the shape in the kernels' launch errors (flash_call.cpp).
std::string flash_shape_str(const FlashShape& s);

// Both throw ringtrain::Error naming the kernel and the shape when a launch fails.
void flash_forward(const FlashFwdCall& c, cudaStream_t stream);
void flash_backward(const FlashBwdCall& c, cudaStream_t stream);

}  // namespace ringtrain::attention::cuda
