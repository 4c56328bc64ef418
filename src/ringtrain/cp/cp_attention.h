// Context-parallel attention: one entry point for every way of moving KV between the cp ranks.
//
// Each rank calls with its zigzag shard (cp/zigzag.h) of q, k, v (and o, dout, lse for the backward):
// `local` describes the local tensors (seqlen_q = seqlen_kv = ZigzagLayout::local_len(), mask None or causal
// over the global sequence), global_len is the unpadded sequence length. Outputs cover the local shard; padding
// rows get O = 0, LSE = -inf and zero gradients. Every block computation goes through attention::forward /
// backward inside BackendScope::context_parallel(cp), opened here, so only backends verified under CP run,
// whatever scopes the caller has open. Buffers live on comm.device().
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ringtrain/attention/params.h"
#include "ringtrain/comm/communicator.h"

namespace ringtrain::cp {

// Ring: pass KV blocks around the ring, overlapped with compute.
// AllGather: gather all KV once, attend with causal offsets, reduce-scatter dK/dV.
// AllToAll (Ulysses): trade sequence shards for head groups, attend the whole sequence for Hq/cp query heads,
// trade back; needs heads_q and heads_kv divisible by cp.
enum class CpComm { Ring, AllGather, AllToAll };
std::string_view cp_comm_name(CpComm c);
CpComm parse_cp_comm(std::string_view name);  // "ring", "allgather", "a2a"

struct CpConfig {
  CpComm comm = CpComm::Ring;
};

// The KV block a ring forward ends on (rank r+1's), kept for the backward of the same call: that backward starts on
// it and ends on the own block, so none of its exchanges waits uncovered; without it, the backward first fetches the
// block. Holds one local K+V block of memory until the backward takes it. The other algorithms leave it empty.
struct KeptKv {
  Tensor kv;                // [K | V] of the block, as KvPack lays it out
  const void* k = nullptr;  // the forward's k and v: the backward must get the same ones
  const void* v = nullptr;
};

// `kept` (optional) is filled by the forward and taken by the backward of the same q, k, v.
void attention_forward(comm::Communicator& comm, const CpConfig& cfg, const attention::AttnParams& local,
                       const attention::AttnForwardArgs& a, int64_t global_len, KeptKv* kept = nullptr);
// a.o and a.lse are the outputs of attention_forward; accumulate must be false.
void attention_backward(comm::Communicator& comm, const CpConfig& cfg, const attention::AttnParams& local,
                        const attention::AttnBackwardArgs& a, int64_t global_len, KeptKv* kept = nullptr);

// Packed documents (THD, `local.packed`): the local tensors hold this rank's per-document zigzag shards
// (PackedZigzag: 2 * c_d rows for document d, in order; LSE [Hq, T_local]); doc_lens are the global lengths.
// Every document attends only its own rows, so no token sees another document. Every algorithm moves the rows of all
// documents together: the ring in each of its exchanges, the all-gather in one all-gather (and one reduce-scatter
// backward), all-to-all in one all-to-all per tensor, whatever the number of documents.
void packed_attention_forward(comm::Communicator& comm, const CpConfig& cfg, const attention::AttnParams& local,
                              const attention::AttnForwardArgs& a, const std::vector<int64_t>& doc_lens);
void packed_attention_backward(comm::Communicator& comm, const CpConfig& cfg, const attention::AttnParams& local,
                               const attention::AttnBackwardArgs& a, const std::vector<int64_t>& doc_lens);

}  // namespace ringtrain::cp
