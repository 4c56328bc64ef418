#include "ringtrain/cp/cp_attention.h"

#include "ringtrain/core/error.h"
#include "ringtrain/cp/allgather_attention.h"
#include "ringtrain/cp/ring_attention.h"
#include "ringtrain/cp/ulysses_attention.h"

namespace ringtrain::cp {

std::string_view cp_comm_name(CpComm c) {
  switch (c) {
    case CpComm::Ring: return "ring";
    case CpComm::AllGather: return "allgather";
    case CpComm::AllToAll: return "a2a";
  }
  return "?";
}

CpComm parse_cp_comm(std::string_view name) {
  if (name == "ring") return CpComm::Ring;
  if (name == "allgather" || name == "all-gather") return CpComm::AllGather;
  if (name == "a2a" || name == "alltoall" || name == "ulysses") return CpComm::AllToAll;
  throw Error(cat("unknown context-parallel communication '", name, "' (expected ring, allgather or a2a)"));
}

void attention_forward(comm::Communicator& comm, const CpConfig& cfg, const attention::AttnParams& local,
                       const attention::AttnForwardArgs& a, int64_t global_len) {
  switch (cfg.comm) {
    case CpComm::Ring: return ring_attention_forward(comm, local, a, global_len);
    case CpComm::AllGather: return allgather_attention_forward(comm, local, a, global_len);
    case CpComm::AllToAll: return ulysses_attention_forward(comm, local, a, global_len);
  }
}

void attention_backward(comm::Communicator& comm, const CpConfig& cfg, const attention::AttnParams& local,
                        const attention::AttnBackwardArgs& a, int64_t global_len) {
  switch (cfg.comm) {
    case CpComm::Ring: return ring_attention_backward(comm, local, a, global_len);
    case CpComm::AllGather: return allgather_attention_backward(comm, local, a, global_len);
    case CpComm::AllToAll: return ulysses_attention_backward(comm, local, a, global_len);
  }
}

}  // namespace ringtrain::cp
