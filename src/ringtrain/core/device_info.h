// What GPUs this process can use. Works in every build (through core's device tables, device_ops.h): without CUDA
// support there are none, and the reasons say so.
#pragma once

#include <cstdint>
#include <string>

#include "ringtrain/core/tensor.h"

namespace ringtrain {

// Number of usable CUDA devices (0 in a build without CUDA, or when the driver reports none).
int cuda_device_count();
// Why there is no usable GPU ("this build of ringtrain has no CUDA support", "no usable CUDA device: <driver
// message>"), or "" when there is one.
std::string cuda_unavailable_reason();
// Compute capability as major*10 + minor (90 for Hopper); 0 when unknown or without CUDA.
int cuda_arch(int device);
// Why `device` cannot run this build's GPU kernels (not a CUDA device, no usable GPU, not a Hopper GPU: they are
// built for sm_90a), or "" when it can. Every GPU backend reports this reason first.
std::string hopper_unavailable_reason(Device device);
// Waits for all work on the device (a no-op on the CPU, and without CUDA).
void synchronize(Device device);
// The high-water mark of the device's default memory pool (where Tensor allocates) in bytes since the last reset
// (0 without CUDA), and restarting it from what is in use now.
uint64_t cuda_pool_peak_bytes(int device);
void cuda_reset_pool_peak(int device);

}  // namespace ringtrain
