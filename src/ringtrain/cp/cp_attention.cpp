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

// The dense params of document d's local rows.
attention::AttnParams doc_params(const attention::AttnParams& p, const ZigzagLayout& l) {
  attention::AttnParams d = p;
  d.packed = false;
  d.batch = 1;
  d.seqlen_q = d.seqlen_kv = l.local_len();
  return d;
}

}  // namespace

void packed_attention_forward(comm::Communicator& comm, const CpConfig& cfg, const attention::AttnParams& local,
                              const attention::AttnForwardArgs& a, const std::vector<int64_t>& doc_lens) {
  const PackedZigzag l = check_packed("packed CP attention forward", comm, local, a.q, doc_lens);
  if (cfg.comm == CpComm::Ring) return ring_packed_attention_forward(comm, local, a, l);
  if (cfg.comm == CpComm::AllGather) return allgather_packed_attention_forward(comm, local, a, l);
  for (size_t d = 0; d < doc_lens.size(); ++d) {
    const ZigzagLayout dl = l.doc(d);
    const int64_t s = l.local_start(d), n = dl.local_len();
    attention::AttnForwardArgs f;
    f.q = packed_rows(a.q, s, n);
    f.k = packed_rows(a.k, s, n);
    f.v = packed_rows(a.v, s, n);
    f.o = packed_rows(a.o, s, n);
    f.lse = packed_lse(a.lse, s, n);
    f.stream = a.stream;
    attention_forward(comm, cfg, doc_params(local, dl), f, doc_lens[d]);
  }
}

void packed_attention_backward(comm::Communicator& comm, const CpConfig& cfg, const attention::AttnParams& local,
                               const attention::AttnBackwardArgs& a, const std::vector<int64_t>& doc_lens) {
  const PackedZigzag l = check_packed("packed CP attention backward", comm, local, a.q, doc_lens);
  if (cfg.comm == CpComm::Ring) return ring_packed_attention_backward(comm, local, a, l);
  if (cfg.comm == CpComm::AllGather) return allgather_packed_attention_backward(comm, local, a, l);
  for (size_t d = 0; d < doc_lens.size(); ++d) {
    const ZigzagLayout dl = l.doc(d);
    const int64_t s = l.local_start(d), n = dl.local_len();
    attention::AttnBackwardArgs b;
    b.q = packed_rows(a.q, s, n);
    b.k = packed_rows(a.k, s, n);
    b.v = packed_rows(a.v, s, n);
    b.o = packed_rows(a.o, s, n);
    b.dout = packed_rows(a.dout, s, n);
    b.lse = packed_lse(a.lse, s, n);
    b.dq = packed_rows(a.dq, s, n);
    b.dk = packed_rows(a.dk, s, n);
    b.dv = packed_rows(a.dv, s, n);
    b.stream = a.stream;
    attention_backward(comm, cfg, doc_params(local, dl), b, doc_lens[d]);
  }
}

}  // namespace ringtrain::cp
