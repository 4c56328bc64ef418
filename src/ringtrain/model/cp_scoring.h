// The model under context parallelism (run by the policies, model/policy.h): each rank of a cp group holds the
// zigzag shard of its sequences (cp/zigzag.h) at their global positions; attention runs through
// cp::attention_forward/backward, everything else is per token. Every rank holds the same weights.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ringtrain/comm/communicator.h"
#include "ringtrain/cp/cp_attention.h"
#include "ringtrain/cp/zigzag.h"
#include "ringtrain/model/sequence_attention.h"

namespace ringtrain::model {

// Causal attention of this rank's zigzag shard of a global_len-token sequence.
std::unique_ptr<SequenceAttention> make_cp_attention(comm::Communicator& comm, cp::CpConfig config,
                                                     int64_t global_len);
// Packed documents under CP: this rank's row holds its zigzag shard of every document, in document order
// (cp::PackedZigzag); each document attends only within itself (cp::packed_attention_forward/backward).
std::unique_ptr<SequenceAttention> make_cp_packed_attention(comm::Communicator& comm, cp::CpConfig config,
                                                            std::vector<int64_t> doc_lens);

// This rank's rows of a sharded sequence: tokens at their global positions, the global next token as target (-1 for
// the last token and for padding; padding rows carry token 0). For code that drives a model directly (the model
// benchmark); the policies lay out whole batches (batch_rows.h).
struct CpShard {
  std::vector<int32_t> tokens, positions, targets;
  std::vector<int64_t> global;  // global index of each local row
};
CpShard make_cp_shard(const cp::ZigzagLayout& layout, const std::vector<int32_t>& ids);

}  // namespace ringtrain::model
