// What GPUs this process can use. Works in every build: without CUDA support there are none.
#pragma once

#include <cstdint>
#include <string>

namespace ringtrain {

// Number of usable CUDA devices (0 in a build without CUDA, or when the driver reports none).
int cuda_device_count();
// Why there is no usable GPU ("this build has no CUDA support", "no CUDA device: <driver message>"),
// or "" when there is one.
std::string cuda_unavailable_reason();
// Compute capability as major*10 + minor (90 for Hopper); 0 when unknown.
int cuda_arch(int device);
// Waits for all work on the device (a no-op without CUDA).
void cuda_synchronize(int device);
// The high-water mark of the device's default memory pool (where Tensor allocates) in bytes since the last reset
// (0 without CUDA), and restarting it from what is in use now.
uint64_t cuda_pool_peak_bytes(int device);
void cuda_reset_pool_peak(int device);

}  // namespace ringtrain
