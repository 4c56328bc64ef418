// The device version of cp::merge_partial (CUDA builds only): same views, same formula (in fp32), one warp per row.
#pragma once

#include "ringtrain/core/tensor.h"

namespace ringtrain::cp::cuda {

// (o_a, lse_a) <- merge of (o_a, lse_a) and (o_b, lse_b); device views, o [B, n, H, D] fp32, bf16 or fp16 (each
// side its own), lse [B, H, n] fp32.
// Enqueued on `stream` (a cudaStream_t; nullptr = the legacy default stream).
void merge_partial(const TensorView& o_a, const TensorView& lse_a, const TensorView& o_b, const TensorView& lse_b,
                   void* stream);

}  // namespace ringtrain::cp::cuda
