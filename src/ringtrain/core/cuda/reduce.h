// Deterministic fp64 reductions of device values (CUDA builds only): the gradient norm's sums of squares, whole
// (train/ sums a gradient shard) or range by range while a backward runs (model/cuda/gpu_model.h). Enqueued on
// `stream` (nullptr: the legacy default stream), not waited for.
#pragma once

#include <cstdint>

namespace ringtrain::cuda_ops {

constexpr int kMaxSumBlocks = 1024;

// Σ x² of n fp32 values in fp64, in an order fixed by n and `blocks` (1 to kMaxSumBlocks) alone, so bitwise
// reproducible: thread i of the grid adds the groups of four elements i, i + stride, ..., each block's threads
// are added in a fixed tree into partial[block] (`blocks` doubles of scratch), and those in a fixed tree into
// *result.
void sum_of_squares(const float* x, int64_t n, int blocks, double* partial, double* result, void* stream);
// The number of blocks that sum_of_squares uses for n values at most `cap`: one 256-thread block per 1,024 values.
int sum_blocks_for(int64_t n, int cap = kMaxSumBlocks);
// *result = Σ x[i] over i < n (at most kMaxSumBlocks) in a fixed tree.
void sum(const double* x, int n, double* result, void* stream);

}  // namespace ringtrain::cuda_ops
