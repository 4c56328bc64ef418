// The Hopper (sm_90a, wgmma) flash backward, called by flash_backward (flash_bwd.cu) outside deterministic mode.
// (The Hopper forward is flash_forward itself, in flash_fwd_sm90.cu.)
#pragma once

#include <cuda_runtime_api.h>

#include "ringtrain/attention/cuda/flash_kernels.h"

namespace ringtrain::attention::cuda {

// delta: rowsum(dO * O), LSE-shaped, already computed on `stream`.
void flash_backward_sm90(const FlashBwdCall& c, const FlashStats& delta, cudaStream_t stream);

}  // namespace ringtrain::attention::cuda
