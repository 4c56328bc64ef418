// Who this process is in a multi-process job, and a TCP rendezvous that hands rank 0's bytes (the NCCL unique
// id) to every rank.
//
// Rank variables are read, in this order, from: torchrun / `ringtrain launch` (RANK, WORLD_SIZE, LOCAL_RANK),
// OpenMPI (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK), Slurm (SLURM_PROCID,
// SLURM_NTASKS, SLURM_LOCALID). The rendezvous address is MASTER_ADDR:MASTER_PORT (defaults 127.0.0.1:29500,
// enough for one node; multi-node mpirun/srun jobs export MASTER_ADDR to the first node's address).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ringtrain::comm {

struct RankInfo {
  int rank = 0;
  int world = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string source;  // which launcher's variables were found ("torchrun", "openmpi", "slurm", "single process")
};

// Reads the variables from `env` (the process environment when empty is passed: see rank_info_from_environment).
RankInfo rank_info_from(const std::map<std::string, std::string>& env);
RankInfo rank_info_from_environment();

// Rank 0 listens on master_port and sends `payload` to the other world-1 ranks; the others connect (retrying
// until the deadline) and return what rank 0 sent. Every rank gets the payload back. Throws comm::CommError
// naming the address and the ranks still missing when the timeout passes.
std::vector<uint8_t> rendezvous_broadcast(const RankInfo& info, const std::vector<uint8_t>& payload,
                                          std::chrono::milliseconds timeout);

}  // namespace ringtrain::comm
