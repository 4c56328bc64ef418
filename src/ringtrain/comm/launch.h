// `ringtrain launch`: starts one process per rank on this node, with the variables torchrun would set.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace ringtrain::comm {

struct LaunchOptions {
  int nproc = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // After one rank fails, how long the others get between SIGTERM and SIGKILL.
  std::chrono::milliseconds grace{5000};
  // After SIGINT, SIGTERM or SIGHUP to the launcher, how long the ranks get between SIGTERM and SIGKILL: ringtrain's
  // training and scoring commands take the SIGTERM as a request to stop at their next microbatch, every rank together.
  // A second signal to the launcher kills them at once. A signal the launcher was started ignoring stays ignored.
  std::chrono::milliseconds stop_grace{30000};
};

struct LaunchResult {
  // 0 when every rank succeeded, else the first failing rank's exit code (128 + signal for a signal), or 128 + the
  // signal that stopped the launch when no rank had failed before it.
  int code = 0;
  // The signal to the launcher (SIGINT, SIGTERM, SIGHUP) that stopped the ranks, else 0: a caller that ends by it, as
  // `ringtrain launch` does, lets a shell script see the interrupt (bash ends a loop only for a child that SIGINT
  // killed).
  int signal = 0;
};

// Runs argv (argv[0] looked up in PATH) nproc times with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT and NCCL_NVLS_ENABLE=0 set. Waits for all; when one exits non-zero (or is killed),
// the others are terminated. The failure is reported on stderr with the rank named.
LaunchResult launch_local(const LaunchOptions& opts, const std::vector<std::string>& argv);

}  // namespace ringtrain::comm
