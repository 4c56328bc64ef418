#include "ringtrain/cli/multi_gpu.h"

#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "ringtrain/cli/commands.h"
#include "ringtrain/comm/gpu_communicator.h"
#include "ringtrain/comm/in_process.h"
#include "ringtrain/comm/launch.h"
#include "ringtrain/comm/rendezvous.h"
#include "ringtrain/core/device_info.h"
#include "ringtrain/core/error.h"

namespace ringtrain::cli {

bool inside_ranks(int world) {
  const comm::RankInfo info = comm::rank_info_from_environment();
  if (info.source == "single process") return false;
  RT_CHECK(info.world == world, "this process is rank ", info.rank, " of ", info.world, " (", info.source,
           " variables) but the command asks for ", world, " ranks");
  return true;
}

void check_one_process_on_cpu(const char* command, int world) {
  const comm::RankInfo info = comm::rank_info_from_environment();
  RT_CHECK(info.source == "single process" || info.world == 1, command, " on the CPU runs its ", world,
           " rank(s) (parallel.dp x parallel.cp) as threads of one process, but this process is rank ", info.rank,
           " of ", info.world, " (", info.source, " variables): start it once, without a launcher (the GPU runs ",
           "one process per GPU)");
}

Exit relaunch_self(int world, const std::vector<std::string>& extra_args, std::chrono::milliseconds stop_grace) {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> argv;
  for (std::string arg; std::getline(f, arg, '\0');) argv.push_back(arg);
  RT_CHECK(!argv.empty(), "cannot read this process's command line from /proc/self/cmdline");
  argv[0] = "/proc/self/exe";
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  comm::LaunchOptions o;
  o.nproc = world;
  o.master_port = 29500 + static_cast<int>(std::random_device{}() % 10000);  // no clash with a job next door
  o.stop_grace = stop_grace;
  const comm::LaunchResult r = comm::launch_local(o, argv);
  return Exit{r.code, r.signal};
}

std::chrono::milliseconds saving_stop_grace(std::chrono::seconds timeout) { return timeout + std::chrono::minutes(1); }

std::unique_ptr<comm::Communicator> nccl_from_environment(std::chrono::milliseconds timeout) {
  return comm::make_gpu_communicator(comm::rank_info_from_environment(), timeout);
}

void require_cuda(const char* what) {
  if (const std::string why = cuda_unavailable_reason(); !why.empty()) {
    std::fprintf(stderr, "ringtrain %s: device cuda cannot run here: %s\n", what, why.c_str());
    throw Exit{2};
  }
}

void require_gpus(int gpus, const char* what) {
  require_cuda(what);
  if (cuda_device_count() < gpus) {
    std::fprintf(stderr, "ringtrain %s: --cp %d needs %d GPUs on this node, found %d\n", what, gpus, gpus,
                 cuda_device_count());
    throw Exit{2};
  }
  if (gpus > 1) {
    if (const std::string why = comm::gpu_communicator_unavailable_reason(); !why.empty()) {
      std::fprintf(stderr, "ringtrain %s: --cp %d cannot run here: %s\n", what, gpus, why.c_str());
      throw Exit{2};
    }
  }
}

bool run_on_ranks(const worker::Config& c, std::chrono::milliseconds timeout,
                  const std::function<void(comm::Communicator&, worker::StartingWeights*)>& rank) {
  if (c.device.is_cuda()) {
    const auto comm = nccl_from_environment(timeout);
    rank(*comm, nullptr);
    return comm->rank() == 0;
  }
  worker::StartingWeights shared;
  comm::run_ranks(static_cast<int>(c.parallel.world()), timeout,
                  [&](comm::Communicator& comm) { rank(comm, &shared); });
  return true;
}

}  // namespace ringtrain::cli
