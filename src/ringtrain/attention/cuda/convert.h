// Strided copies between device tensors of any float dtype (fp32, bf16, fp16), optionally adding into the
// destination: stride matching before cuDNN's backward, fp32 outputs from 16-bit results, accumulate mode.
#pragma once

#include <cuda_runtime_api.h>

#include "ringtrain/core/tensor.h"

namespace ringtrain::attention::cuda {

// dst = src (or dst += src when accumulate), elementwise over views of one shape (up to 4 dimensions).
void convert_copy(cudaStream_t stream, const TensorView& dst, const TensorView& src, bool accumulate = false);

}  // namespace ringtrain::attention::cuda
