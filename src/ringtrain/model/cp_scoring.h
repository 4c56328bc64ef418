// The model under context parallelism: each rank of a cp group holds the zigzag shard of one sequence
// (cp/zigzag.h) at its global positions; attention runs through cp::attention_forward/backward (ring or
// all-gather), everything else is per token. Every rank holds the same weights.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ringtrain/comm/communicator.h"
#include "ringtrain/cp/cp_attention.h"
#include "ringtrain/model/logprobs.h"
#include "ringtrain/model/sequence_attention.h"

namespace ringtrain::model {

// Causal attention of this rank's zigzag shard of a global_len-token sequence.
std::unique_ptr<SequenceAttention> make_cp_attention(comm::Communicator& comm, cp::CpConfig config,
                                                     int64_t global_len);

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
