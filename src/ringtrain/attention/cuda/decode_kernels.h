// The `decode` GPU kernels' view of one KV-cache attention call (AttnParams::kv_cache): a few query rows per
// sequence against a padded bf16/fp16 cache of which each sequence uses its own prefix (kv_used, on the device).
// Strides are in elements; the head dimension has unit stride.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ringtrain/attention/cuda/flash_kernels.h"

namespace ringtrain::attention::cuda {

// Query rows of one kv head a block serves at once: Hq / Hkv heads times Sq rows.
constexpr int kDecodeMaxRows = 16;

struct DecodeCall {
  int batch = 1, heads_q = 1, heads_kv = 1, head_dim = 64, seqlen_q = 1, capacity = 0;
  int mask = kMaskCausalBottomRight;  // FlashMask: none or bottom-right (against kv_used)
  int window = 0;  // sliding window in keys (AttnParams::window), bottom-right only, less than capacity; 0: none
  float scale = 1.f;
  bool bf16 = true;  // else fp16 (q, k, v)
  FlashRows q, k, v, o;  // o: the inputs' dtype or fp32
  FlashStats lse;
  const int32_t* kv_used = nullptr;  // [batch], device
};

// Keys are split over blocks of a fixed number of keys per (sequence, kv head); with more than one split the partial
// results (fp32) are merged in a second kernel. A row's result does not depend on the rest of the batch. Throws
// ringtrain::Error on a launch failure.
void decode_forward(const DecodeCall& c, cudaStream_t stream);
// Head dims the kernels are built for: 16, 32, 64, 128.
bool decode_head_dim_supported(int64_t head_dim);

}  // namespace ringtrain::attention::cuda
