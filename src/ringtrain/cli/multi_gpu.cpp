#include "ringtrain/cli/multi_gpu.h"

#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "ringtrain/comm/launch.h"
#include "ringtrain/comm/rendezvous.h"
#include "ringtrain/core/error.h"
#ifdef RINGTRAIN_WITH_NCCL
#include "ringtrain/comm/nccl/nccl_communicator.h"
#endif

namespace ringtrain::cli {

bool inside_ranks(int world) {
  const comm::RankInfo info = comm::rank_info_from_environment();
  if (info.source == "single process") return false;
  RT_CHECK(info.world == world, "this process is rank ", info.rank, " of ", info.world, " (", info.source,
           " variables) but the command asks for ", world, " ranks");
  return true;
}

int relaunch_self(int world) {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> argv;
  for (std::string arg; std::getline(f, arg, '\0');) argv.push_back(arg);
  RT_CHECK(!argv.empty(), "cannot read this process's command line from /proc/self/cmdline");
  argv[0] = "/proc/self/exe";
  comm::LaunchOptions o;
  o.nproc = world;
  o.master_port = 29500 + static_cast<int>(std::random_device{}() % 10000);  // no clash with a job next door
  return comm::launch_local(o, argv);
}

std::unique_ptr<comm::Communicator> nccl_from_environment(std::chrono::milliseconds timeout) {
#ifdef RINGTRAIN_WITH_NCCL
  return comm::make_nccl_communicator(comm::rank_info_from_environment(), timeout);
#else
  (void)timeout;
  throw Error("this build of ringtrain has no NCCL communicator (build with CUDA and NCCL to run on several GPUs)");
#endif
}

}  // namespace ringtrain::cli
