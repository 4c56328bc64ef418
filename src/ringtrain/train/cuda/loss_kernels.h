// CUDA implementation of train::DeviceLossKernels (loss_kernels.cu): the gathers of a microbatch's inputs, the counts,
// the token-local gradient, and the NLL / clipped PG / DPO values and metric sums.
#pragma once

#include "ringtrain/train/device_loss.h"

namespace ringtrain::train::cuda {

const DeviceLossKernels* loss_kernels();

}  // namespace ringtrain::train::cuda
