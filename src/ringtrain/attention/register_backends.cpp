// Every attention implementation this build has, in one place: the CPU ones always, the GPU ones in CUDA builds (the
// order is irrelevant: selection.h decides the preference). Explicit calls, not self-registering static objects, so
// that linking the static library keeps them.
#include "ringtrain/attention/backend.h"
#include "ringtrain/attention/cpu/cpu_backends.h"

#ifdef RINGTRAIN_WITH_CUDA
#include "ringtrain/attention/cuda/cuda_backends.h"
#endif

namespace ringtrain::attention {

void register_backends(std::vector<std::unique_ptr<Backend>>& out) {
  out.push_back(cpu::make_math_backend());
  out.push_back(cpu::make_flash_backend());
#ifdef RINGTRAIN_WITH_CUDA
  register_cuda_backends(out);
#endif
}

}  // namespace ringtrain::attention
