// The model under context parallelism: each rank of a cp group holds the zigzag shard of one sequence
// (cp/zigzag.h) at its global positions; attention runs through cp::attention_forward/backward (ring or
// all-gather), everything else is per token. Every rank holds the same weights.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ringtrain/comm/communicator.h"
#include "ringtrain/cp/cp_attention.h"
#include "ringtrain/cp/zigzag.h"
#include "ringtrain/model/logprobs.h"
#include "ringtrain/model/sequence_attention.h"

namespace ringtrain::model {

// Causal attention of this rank's zigzag shard of a global_len-token sequence.
std::unique_ptr<SequenceAttention> make_cp_attention(comm::Communicator& comm, cp::CpConfig config,
                                                     int64_t global_len);

// This rank's rows of a sharded sequence: tokens at their global positions, the global next token as target (-1 for
// the last token and for padding; padding rows carry token 0). Shared by the CPU and GPU models.
struct CpShard {
  std::vector<int32_t> tokens, positions, targets;
  std::vector<int64_t> global;  // global index of each local row
};
CpShard make_cp_shard(const cp::ZigzagLayout& layout, const std::vector<int32_t>& ids);
// This rank's part of a CP scoring call on the whole sequence `ids` (not empty): its layout, its shard and the
// attention over it. Shared by the CPU and GPU models.
struct CpCall {
  cp::ZigzagLayout layout;
  CpShard shard;
  std::unique_ptr<SequenceAttention> attention;
};
CpCall make_cp_call(comm::Communicator& comm, const cp::CpConfig& config, const std::vector<int32_t>& ids);
// The whole [seq_len] log-probabilities in token order (position 0 = 0) from every rank's row results, gathered as
// cp blocks of local_len rows (block r from rank r).
template <typename T>
std::vector<T> cp_rows_to_tokens(const std::vector<T>& gathered, int cp, int64_t seq_len);
// d(loss)/d(row result) for this rank's rows, from d(loss)/d(logprob[p]) in token order.
template <typename T>
std::vector<T> cp_row_grads(const CpShard& shard, const std::vector<T>& d_logprobs);

// Called on every rank with the whole sequence: returns the whole [S] log-probabilities in token order
// (position 0 = 0) on every rank, gathered from the shards.
template <typename T>
std::vector<T> cp_sequence_logprobs(Model<T>& model, comm::Communicator& comm, const cp::CpConfig& config,
                                    const std::vector<int32_t>& ids, int64_t chunk_tokens, bool for_backward = false);
// After cp_sequence_logprobs(..., true): adds this rank's share of the weight gradients of a loss given
// d(loss)/d(logprob[p]) in token order (the same on every rank); the sum of the shares over the cp group is the
// gradient (an all-reduce over dp·cp does it in training).
template <typename T>
void cp_sequence_logprobs_backward(Model<T>& model, comm::Communicator& comm, const cp::CpConfig& config,
                                   const std::vector<int32_t>& ids, const std::vector<T>& d_logprobs,
                                   int64_t chunk_tokens);

}  // namespace ringtrain::model
