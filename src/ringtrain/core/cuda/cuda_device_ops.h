// core's device table for CUDA GPUs (CUDA builds only): reached through register_devices.cpp.
#pragma once

#include "ringtrain/core/device_ops.h"

namespace ringtrain::cuda {

const DeviceOps& cuda_device_ops();

}  // namespace ringtrain::cuda
