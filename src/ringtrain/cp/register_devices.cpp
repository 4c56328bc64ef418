// cp's device kernels this build has, in one place: the only file of cp that depends on the build's options.
#include "ringtrain/cp/cp_common.h"

#ifdef RINGTRAIN_WITH_CUDA
#include "ringtrain/cp/cuda/merge.h"
#endif

namespace ringtrain::cp {

MergePartialFn find_device_merge_partial(DeviceKind kind) {
#ifdef RINGTRAIN_WITH_CUDA
  if (kind == DeviceKind::CUDA) return &cuda::merge_partial;
#endif
  return nullptr;
}

}  // namespace ringtrain::cp
