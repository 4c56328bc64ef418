#include "ringtrain/core/device_info.h"

#include "ringtrain/core/device_ops.h"
#include "ringtrain/core/error.h"

namespace ringtrain {

int cuda_device_count() {
  const DeviceOps* ops = find_device_ops(DeviceKind::CUDA);
  return ops ? ops->device_count() : 0;
}

std::string cuda_unavailable_reason() {
  const DeviceOps* ops = find_device_ops(DeviceKind::CUDA);
  return ops ? ops->unavailable_reason() : "this build of ringtrain has no CUDA support";
}

int cuda_arch(int device) {
  const DeviceOps* ops = find_device_ops(DeviceKind::CUDA);
  return ops ? ops->arch(device) : 0;
}

std::string hopper_unavailable_reason(Device device) {
  if (!device.is_cuda()) return cat("runs on CUDA devices, not ", device_name(device));
  if (std::string why = cuda_unavailable_reason(); !why.empty()) return why;
  const int count = cuda_device_count();
  if (device.index < 0 || device.index >= count)
    return cat(device_name(device), " does not exist (", count, " CUDA device", count == 1 ? "" : "s", ")");
  if (const int arch = cuda_arch(device.index); arch != 90)
    return cat("this build's GPU kernels are for sm_90a (Hopper); ", device_name(device), " has compute capability ",
               arch / 10, ".", arch % 10);
  return "";
}

void synchronize(Device device) {
  if (!device.is_cuda()) return;
  if (const DeviceOps* ops = find_device_ops(DeviceKind::CUDA)) ops->synchronize(device.index);
}

uint64_t cuda_pool_peak_bytes(int device) {
  const DeviceOps* ops = find_device_ops(DeviceKind::CUDA);
  return ops ? ops->pool_peak_bytes(device) : 0;
}

void cuda_reset_pool_peak(int device) {
  if (const DeviceOps* ops = find_device_ops(DeviceKind::CUDA)) ops->reset_pool_peak(device);
}

}  // namespace ringtrain
