// The kinds of device this build supports, in one place: the only file of core that depends on the build's options.
// Explicit calls, not self-registering static objects, so that linking the static library keeps them.
#include "ringtrain/core/device_ops.h"

#ifdef RINGTRAIN_WITH_CUDA
#include "ringtrain/core/cuda/cuda_device_ops.h"
#endif

namespace ringtrain {

void register_device_ops(DeviceOpsRegistry& registry) {
  registry.cpu = &host_device_ops();
#ifdef RINGTRAIN_WITH_CUDA
  registry.cuda = &cuda::cuda_device_ops();
#endif
}

}  // namespace ringtrain
