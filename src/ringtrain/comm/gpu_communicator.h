// The communicator of multi-GPU runs, one process per GPU, in every build: NCCL where the build has it (nccl/), an
// Error that says why not elsewhere.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "ringtrain/comm/communicator.h"
#include "ringtrain/comm/rendezvous.h"

namespace ringtrain::comm {

// Why this build cannot make GPU communicators, or "" when it can.
std::string gpu_communicator_unavailable_reason();
// This rank's GPU communicator (GPU = local rank), set up through the TCP rendezvous of `info`.
std::unique_ptr<Communicator> make_gpu_communicator(const RankInfo& info, std::chrono::milliseconds timeout);

}  // namespace ringtrain::comm
