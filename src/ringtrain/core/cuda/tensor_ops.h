// Device-side element-wise tensor operations behind core's copy() and fill() (CUDA builds only).
#pragma once

#include "ringtrain/core/tensor.h"

namespace ringtrain::cuda_ops {

// dst <- src, both on the same CUDA device, any strides (up to 4-D), any dtypes (converted through fp64).
// Enqueued on `stream` (nullptr: the legacy default stream).
void strided_copy(const TensorView& dst, const TensorView& src, void* stream);
// N(0, stddev) values from (seed, row-major element number): see core/hashed_normal.h.
void fill_normal(const TensorView& dst, uint64_t seed, double stddev, void* stream);
// Every element of a device view set to value.
void fill(const TensorView& dst, double value, void* stream);

}  // namespace ringtrain::cuda_ops
