// Helpers for commands that run on several GPUs: one process per GPU, started by `ringtrain launch` (or torchrun,
// mpirun, srun). A command run by hand re-runs itself on the ranks.
#pragma once

#include <chrono>
#include <memory>

#include "ringtrain/comm/communicator.h"

namespace ringtrain::cli {

// True when this process is one of `world` ranks (rank variables present with that world size).
bool inside_ranks(int world);
// Runs this process's own command line again as `world` local ranks (ringtrain launch) and returns their exit code.
int relaunch_self(int world);
// This rank's NCCL communicator (GPU = local rank); a clear error when the build has no NCCL.
std::unique_ptr<comm::Communicator> nccl_from_environment(std::chrono::milliseconds timeout);

}  // namespace ringtrain::cli
