// The optimizer's device kernels behind an interface, so that train/ reaches them without CUDA headers or #ifdefs:
// device_optimizer_kernels() is nullptr in a build without CUDA (train/device_kernels.cpp, the layer's one
// registration file, decides).
#pragma once

#include <cstdint>

#include "ringtrain/train/optimizer.h"

namespace ringtrain::train {

// One rank's shard of the fp32 AdamW state on the current CUDA device: n elements behind each pointer.
struct DeviceAdamWShard {
  float* master = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  const float* grad = nullptr;
  uint16_t* compute_bf16 = nullptr;  // bf16 bits of the new weights; nullptr: not written
  int64_t n = 0;
};

class DeviceOptimizerKernels {
 public:
  virtual ~DeviceOptimizerKernels() = default;
  // *device_result = Σ x² of n device fp32 values, accumulated in fp64 in an order fixed by n alone (bitwise
  // reproducible). Enqueued on `stream` (nullptr: the legacy default stream), not waited for.
  virtual void sum_of_squares(const float* x, int64_t n, double* device_result, void* stream) const = 0;
  // AdamW with the clip coefficient fused in, the same fp32 arithmetic as train::adamw_update<float> (bitwise equal
  // results). Nothing is enqueued for a skipped step.
  virtual void adamw_update(const AdamWStep& step, const DeviceAdamWShard& shard, void* stream) const = 0;
};

// The CUDA kernels, or nullptr where this build has none.
const DeviceOptimizerKernels* device_optimizer_kernels();

}  // namespace ringtrain::train
