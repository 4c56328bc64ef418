// The ranks a Python process drives, one PolicyWorker each, made as the C++ CLI makes them:
//   device cpu: every rank of the dp x cp mesh is a thread of this process over the in-process communicator
//     (comm::make_in_process_group), so one Python process runs any world size; each call runs on all of them.
//   device cuda: this process is one rank (one GPU) of a job that torchrun / `ringtrain launch` / mpirun / srun (or a
//     Ray-style actor that sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) started, with the NCCL
//     communicator through the TCP rendezvous (comm::make_gpu_communicator); every process makes its worker and
//     calls every method with the same arguments.
// When a call fails on one of several ranks, its communicator is aborted so the others stop waiting, and the group
// is unusable afterwards (every later call says so): make a new worker. Inputs are checked before any rank starts,
// and an error that all ranks raise together (comm::AgreedError: save, load and export paths and files) leaves the
// group usable.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ringtrain/comm/communicator.h"
#include "ringtrain/worker/config.h"
#include "ringtrain/worker/policy_worker.h"

namespace ringtrain::python {

class WorkerGroup {
 public:
  // Collective: constructs the workers (weights loaded or initialised), each watching `stop` (not owned; it must
  // outlive the group; see PolicyWorker). Call without the GIL.
  WorkerGroup(const worker::Config& config, std::chrono::milliseconds timeout, const StopRequest* stop);
  ~WorkerGroup();

  // Runs fn on every rank this process holds (one thread each when several) and waits for all; fn's rank index
  // is 0 .. local_ranks()-1. Rethrows the first root-cause error with its rank named. Call without the GIL.
  void run(const std::function<void(int, worker::PolicyWorker&)>& fn);

  worker::PolicyWorker& lead() { return *workers_.front(); }  // this process's first rank
  // An error saying why when the group cannot be used any more (run checks it first). Under the caller's lock of
  // the group, as run.
  void check_usable() const;
  int rank() const;            // the global rank of lead()
  int world_size() const;      // dp x cp
  int local_ranks() const { return static_cast<int>(workers_.size()); }

 private:
  void run_ranks(const std::function<void(int)>& fn);

  std::vector<std::unique_ptr<comm::Communicator>> comms_;
  std::vector<std::unique_ptr<worker::PolicyWorker>> workers_;
  std::string broken_;  // why the group cannot be used any more
};

}  // namespace ringtrain::python
