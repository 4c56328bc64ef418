// Packed (THD) calls through cuDNN: per-sequence lengths and ragged offsets from cu_seqlens, and moving the
// softmax statistics between cuDNN's padded (B, H, S_max, 1) buffer and the project's LSE [H, T].
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ringtrain::attention::cudnn {

// From cu_seqlens (int32 [B + 1], device): seq_q/seq_kv[b] = lengths, off_q/off_kv[b] = cu[b] * elements per
// token (the ragged offsets of contiguous [T, H, D] tensors), for b <= B (the lengths only for b < B).
void ragged_metadata(cudaStream_t s, const int32_t* cu_q, const int32_t* cu_kv, int64_t batch, int64_t q_token_elems,
                     int64_t kv_token_elems, int32_t* seq_q, int32_t* seq_kv, int32_t* off_q, int32_t* off_kv);

// lse(h, cu[b] + i) = stats[b, h, i] for i < length of sequence b.
void stats_to_lse(cudaStream_t s, const float* stats, const int32_t* cu_q, int64_t batch, int64_t heads, int64_t s_max,
                  float* lse, int64_t lse_head_stride, int64_t lse_row_stride);
// The reverse (rows past a sequence's length are left as they are: cuDNN does not read them).
void lse_to_stats(cudaStream_t s, const float* lse, int64_t lse_head_stride, int64_t lse_row_stride,
                  const int32_t* cu_q, int64_t batch, int64_t heads, int64_t s_max, float* stats);

}  // namespace ringtrain::attention::cudnn
