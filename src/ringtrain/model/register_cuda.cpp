// The model layer's one registration point for its CUDA part (model/cuda/): a build without CUDA defines the GPU
// policy's entry point as an error.
#include "ringtrain/model/gpu_policy.h"

#include "ringtrain/core/error.h"

namespace ringtrain::model {

#ifndef RINGTRAIN_WITH_CUDA
std::unique_ptr<Policy> make_gpu_policy(const ModelConfig&, const std::vector<float>&, const PolicyOptions& options) {
  throw Error(cat("policy: device ", device_name(options.device), " needs CUDA, and this build of ringtrain has none"));
}
#endif

}  // namespace ringtrain::model
