// The train layer's registration of its CUDA part: the only file of train/ (outside cuda/) that names the build.
#include "ringtrain/train/device_loss.h"
#include "ringtrain/train/device_optimizer.h"

#ifdef RINGTRAIN_WITH_CUDA
#include "ringtrain/train/cuda/adamw.h"
#include "ringtrain/train/cuda/loss_kernels.h"
#endif

namespace ringtrain::train {

const DeviceOptimizerKernels* device_optimizer_kernels() {
#ifdef RINGTRAIN_WITH_CUDA
  return cuda::optimizer_kernels();
#else
  return nullptr;
#endif
}

const DeviceLossKernels* device_loss_kernels() {
#ifdef RINGTRAIN_WITH_CUDA
  return cuda::loss_kernels();
#else
  return nullptr;
#endif
}

}  // namespace ringtrain::train
