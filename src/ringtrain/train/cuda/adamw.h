// CUDA implementation of train::DeviceOptimizerKernels (adamw.cu): the fused clip + AdamW update of an fp32 shard
// writing bf16 compute weights, and the deterministic two-stage fp64 sum of squares of core/cuda/reduce.h.
#pragma once

#include "ringtrain/train/device_optimizer.h"

namespace ringtrain::train::cuda {

const DeviceOptimizerKernels* optimizer_kernels();

}  // namespace ringtrain::train::cuda
