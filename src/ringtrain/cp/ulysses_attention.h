// All-to-all (Ulysses) context parallelism: each rank trades its sequence shard of every head for the whole
// sequence of one group of heads (Hq/cp query heads, Hkv/cp kv heads), runs ordinary attention over the whole
// sequence for that group, and trades the results back. Needs heads_q and heads_kv divisible by cp. Use through
// cp/cp_attention.h.
#pragma once

#include "ringtrain/attention/params.h"
#include "ringtrain/comm/communicator.h"
#include "ringtrain/cp/zigzag.h"

namespace ringtrain::cp {

void ulysses_attention_forward(comm::Communicator& comm, const attention::AttnParams& local,
                               const attention::AttnForwardArgs& a, int64_t global_len);
void ulysses_attention_backward(comm::Communicator& comm, const attention::AttnParams& local,
                                const attention::AttnBackwardArgs& a, int64_t global_len);
// Packed documents (THD, local.packed) in one set of all-to-alls for all of them.
void ulysses_packed_attention_forward(comm::Communicator& comm, const attention::AttnParams& local,
                                      const attention::AttnForwardArgs& a, const PackedZigzag& layout);
void ulysses_packed_attention_backward(comm::Communicator& comm, const attention::AttnParams& local,
                                       const attention::AttnBackwardArgs& a, const PackedZigzag& layout);

}  // namespace ringtrain::cp
