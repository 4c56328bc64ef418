// The GPU implementations known to this build, in one place (the order here is irrelevant: selection.h
// decides the preference).
#include "ringtrain/attention/cuda/cuda_backends.h"

namespace ringtrain::attention {

void register_cuda_backends(std::vector<std::unique_ptr<Backend>>& out) {
#ifdef RINGTRAIN_WITH_CUDNN
  out.push_back(make_cudnn_backend());
#endif
  out.push_back(make_cuda_flash_backend());
  out.push_back(make_cuda_efficient_backend());
  out.push_back(make_cuda_math_backend());
  out.push_back(make_cuda_decode_backend());
}

}  // namespace ringtrain::attention
