// The GPU Policy's entry point: defined by model/cuda/gpu_policy.cpp in a CUDA build and by register_cuda.cpp (an
// error saying the build has no CUDA) otherwise, so that make_policy reaches it without a device branch.
#pragma once

#include <memory>
#include <vector>

#include "ringtrain/model/policy.h"

namespace ringtrain::model {

std::unique_ptr<Policy> make_gpu_policy(const ModelConfig& config, const std::vector<float>& params,
                                        const PolicyOptions& options);

}  // namespace ringtrain::model
