// Filling device tensors with N(0, stddev) values on the GPU (benchmarks need gigabytes of random inputs; the
// host generator would take seconds). Counter-based: element i of seed s is the same on every run.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ringtrain/core/tensor.h"

namespace ringtrain::attention::cuda {

void fill_normal_device(cudaStream_t stream, const TensorView& t, uint64_t seed, float stddev = 1.f);

}  // namespace ringtrain::attention::cuda
