#include "ringtrain/cp/cp_attention.h"

#include "ringtrain/core/error.h"
#include "ringtrain/cp/zigzag.h"
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
                       const attention::AttnForwardArgs& a, int64_t global_len, KeptKv* kept) {
  if (kept) *kept = KeptKv{};
  switch (cfg.comm) {
    case CpComm::Ring: return ring_attention_forward(comm, local, a, global_len, kept);
    case CpComm::AllGather: return allgather_attention_forward(comm, local, a, global_len);
    case CpComm::AllToAll: return ulysses_attention_forward(comm, local, a, global_len);
  }
}

void attention_backward(comm::Communicator& comm, const CpConfig& cfg, const attention::AttnParams& local,
                        const attention::AttnBackwardArgs& a, int64_t global_len, KeptKv* kept) {
  switch (cfg.comm) {
    case CpComm::Ring: return ring_attention_backward(comm, local, a, global_len, kept);
    case CpComm::AllGather: return allgather_attention_backward(comm, local, a, global_len);
    case CpComm::AllToAll: return ulysses_attention_backward(comm, local, a, global_len);
  }
}

namespace {

PackedZigzag check_packed(const char* what, const comm::Communicator& comm, const attention::AttnParams& p,
                          const TensorView& q, const std::vector<int64_t>& doc_lens) {
  RT_CHECK(p.packed, what, ": params are not packed (use attention_forward/backward)");
  RT_CHECK(static_cast<int64_t>(doc_lens.size()) == p.batch, what, ": ", doc_lens.size(), " document lengths for ",
           p.batch, " sequences");
  PackedZigzag l(comm.size(), comm.rank(), doc_lens);
  RT_CHECK(q.ndim == 3 && q.shape[0] == l.local_total(), what, ": local q is ", q.shape_str(), ", expected ",
           l.local_total(), " rows (the per-document zigzag shards of ", doc_lens.size(), " documents, cp=", l.cp, ")");
  return l;
}

}  // namespace

void packed_attention_forward(comm::Communicator& comm, const CpConfig& cfg, const attention::AttnParams& local,
                              const attention::AttnForwardArgs& a, const std::vector<int64_t>& doc_lens) {
  const PackedZigzag l = check_packed("packed CP attention forward", comm, local, a.q, doc_lens);
  switch (cfg.comm) {
    case CpComm::Ring: return ring_packed_attention_forward(comm, local, a, l);
    case CpComm::AllGather: return allgather_packed_attention_forward(comm, local, a, l);
    case CpComm::AllToAll: return ulysses_packed_attention_forward(comm, local, a, l);
  }
}

void packed_attention_backward(comm::Communicator& comm, const CpConfig& cfg, const attention::AttnParams& local,
                               const attention::AttnBackwardArgs& a, const std::vector<int64_t>& doc_lens) {
  const PackedZigzag l = check_packed("packed CP attention backward", comm, local, a.q, doc_lens);
  switch (cfg.comm) {
    case CpComm::Ring: return ring_packed_attention_backward(comm, local, a, l);
    case CpComm::AllGather: return allgather_packed_attention_backward(comm, local, a, l);
    case CpComm::AllToAll: return ulysses_packed_attention_backward(comm, local, a, l);
  }
}

}  // namespace ringtrain::cp
