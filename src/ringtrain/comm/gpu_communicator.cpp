// The comm layer's registration file: the NCCL communicator (comm/nccl/) in builds that have NCCL.
#include "ringtrain/comm/gpu_communicator.h"

#include "ringtrain/core/error.h"
#ifdef RINGTRAIN_WITH_NCCL
#include "ringtrain/comm/nccl/nccl_communicator.h"
#endif

namespace ringtrain::comm {

#ifdef RINGTRAIN_WITH_NCCL
std::string gpu_communicator_unavailable_reason() { return ""; }
std::unique_ptr<Communicator> make_gpu_communicator(const RankInfo& info, std::chrono::milliseconds timeout) {
  return make_nccl_communicator(info, timeout);
}
#else
std::string gpu_communicator_unavailable_reason() {
  return "this build of ringtrain has no NCCL communicator (build with CUDA and NCCL to run on several GPUs)";
}
std::unique_ptr<Communicator> make_gpu_communicator(const RankInfo&, std::chrono::milliseconds) {
  throw Error(cat("a GPU communicator is not available in this build: ", gpu_communicator_unavailable_reason()));
}
#endif

}  // namespace ringtrain::comm
