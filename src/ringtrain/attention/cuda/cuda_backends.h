// GPU attention backends (built only with CUDA). Each factory returns one implementation for the registry
// (attention/backend.h); register_cuda_backends() in register.cpp lists them in one place and
// attention/register_backends.cpp calls it.
#pragma once

#include <memory>
#include <vector>

#include "ringtrain/attention/backend.h"

namespace ringtrain::attention {

// Adds the GPU implementations this build has.
void register_cuda_backends(std::vector<std::unique_ptr<Backend>>& out);

// `flash`: the hand-written Hopper kernels (cuda/flash_*).
std::unique_ptr<Backend> make_cuda_flash_backend();
// `efficient`: the general kernels (fp32, head dims up to 256, additive bias, any strides; cuda/efficient_*).
std::unique_ptr<Backend> make_cuda_efficient_backend();
// `math`: the GPU reference (materialised scores through cuBLASLt, fp32 softmax; cuda/math_backend.cu).
std::unique_ptr<Backend> make_cuda_math_backend();
// `decode`: new query rows against a padded KV cache with per-sequence lengths, for generation (cuda/decode_*).
std::unique_ptr<Backend> make_cuda_decode_backend();
// `cudnn`: cuDNN 9 SDPA through the frontend graph API (cudnn/); built only when the frontend headers are
// found at configure time (RINGTRAIN_WITH_CUDNN).
std::unique_ptr<Backend> make_cudnn_backend();

}  // namespace ringtrain::attention
