// Helpers for commands that run on several GPUs: one process per GPU, started by `ringtrain launch` (or torchrun,
// mpirun, srun). A command run by hand re-runs itself on the ranks.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ringtrain/cli/exit.h"
#include "ringtrain/comm/communicator.h"
#include "ringtrain/comm/launch.h"
#include "ringtrain/worker/config.h"
#include "ringtrain/worker/policy_worker.h"

namespace ringtrain::cli {

// True when this process is one of `world` ranks (rank variables present with that world size).
bool inside_ranks(int world);
// A run on the CPU holds its ranks as threads of one process: started as one of several processes (by ringtrain
// launch, torchrun, mpirun or srun), each would be a whole run of its own on the same folders. Error naming the
// launcher's variables unless this process is alone; `command` names the command.
void check_one_process_on_cpu(const char* command, int world);
// Runs this process's own command line again as `world` local ranks (ringtrain launch), with `extra_args` appended
// (e.g. a seed every rank must share), and gives how the command ends: the ranks' exit code, and the signal that
// stopped them (the command ends by it, as `ringtrain launch` does). stop_grace: after Ctrl-C, how long the ranks
// get to stop by themselves (comm::LaunchOptions::stop_grace); a run that saves its finished steps needs longer.
Exit relaunch_self(int world, const std::vector<std::string>& extra_args = {},
                   std::chrono::milliseconds stop_grace = comm::LaunchOptions{}.stop_grace);
// The stop grace of a run that saves at a stop: as long as its ranks wait for one another (--timeout), and a minute.
std::chrono::milliseconds saving_stop_grace(std::chrono::seconds timeout);
// This rank's GPU communicator (GPU = local rank); a clear error when the build has none.
std::unique_ptr<comm::Communicator> nccl_from_environment(std::chrono::milliseconds timeout);
// Ends the command with exit code 2 and the reason unless this build can run on this machine's GPU. `what` names the
// command in the message.
void require_cuda(const char* what);
// require_cuda, and unless this node has `gpus` usable GPUs (and, for more than one, a GPU communicator): --cp N.
void require_gpus(int gpus, const char* what);
// Runs `rank` on each rank of a config's run that lives in this process: this GPU process's rank (one of the config's
// world of GPU processes), or on the CPU its world of ranks as threads that share one copy of the starting weights.
// Returns whether this process holds rank 0 (a CPU run always does).
bool run_on_ranks(const worker::Config& c, std::chrono::milliseconds timeout,
                  const std::function<void(comm::Communicator&, worker::StartingWeights*)>& rank);

}  // namespace ringtrain::cli
