// The GPU policy's side of TokenRows (model/policy.h): a microbatch's tokens and targets gathered from the caller's
// [R, C] id view in device memory, and the scores scattered into the caller's [R, C] result view, both at element
// offsets the host works out from the layout alone (BatchRows::source_offsets, result_offsets), so the ids and the
// results never leave the GPU. Enqueued on `stream`, not waited for.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ringtrain/core/dtype.h"

namespace ringtrain::model::cuda {

// tokens[i] = ids[token_offset[i]] (0 where the offset is -1) and targets[i] = ids[target_offset[i]] (-1 where it is
// -1), for n rows; ids is I32 or I64, read as int32 (the caller has checked every id against the vocabulary).
void gather_token_rows(const void* ids, DType dtype, const int64_t* token_offset, const int64_t* target_offset,
                       int32_t* tokens, int32_t* targets, int64_t n, cudaStream_t stream);

// dst[offset[j]] = src[(j / n) * block_stride + j % n] for the blocks * n entries j whose offset is not -1: every cp
// rank's block of n row results (the gathered scores) into the caller's view.
void scatter_row_results(float* dst, const float* src, const int64_t* offset, int64_t n, int64_t blocks,
                         int64_t block_stride, cudaStream_t stream);

// dst[i] = src[offset[i]] (0 where the offset is -1) for n rows: this rank's d(loss)/d(row result) from the caller's
// view of gradients, at this rank's block of the result offsets.
void gather_row_values(float* dst, const float* src, const int64_t* offset, int64_t n, cudaStream_t stream);

}  // namespace ringtrain::model::cuda
