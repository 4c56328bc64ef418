// Device-side element-wise tensor operations behind core's copy(), fill() and their stream-ordered forms
// (CUDA builds only). Everything is enqueued on `stream` (nullptr: the legacy default stream) and not waited for.
#pragma once

#include <cstdint>
#include <vector>

#include "ringtrain/core/tensor.h"

namespace ringtrain::cuda_ops {

// dst <- src, or dst += src with accumulate, both on the same CUDA device, any strides (up to 4-D), any dtypes.
// Float dtypes convert through fp32 (contiguous views take a vectorised path); integer and fp64 views through fp64.
void strided_copy(const TensorView& dst, const TensorView& src, void* stream, bool accumulate = false);
// N(0, stddev) values from (seed, row-major element number): see core/hashed_normal.h.
void fill_normal(const TensorView& dst, uint64_t seed, double stddev, void* stream);
// Every element of a device view set to value.
void fill(const TensorView& dst, double value, void* stream);

// DeviceOps::first_outside for a device view whose shape and lengths were checked (check_row_lengths); waits.
int64_t first_outside(const TensorView& ids, const std::vector<int64_t>& lengths, int64_t limit);

}  // namespace ringtrain::cuda_ops
