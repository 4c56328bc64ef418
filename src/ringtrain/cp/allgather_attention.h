// All-gather-KV context parallelism: gather K and V of every rank once, put them in global order, attend each
// local query chunk to its global key prefix (causal, bottom-right aligned); the backward reduce-scatters the
// fp32 dK/dV of the gathered sequence back to the ranks. Use through cp/cp_attention.h.
#pragma once

#include "ringtrain/attention/params.h"
#include "ringtrain/comm/communicator.h"
#include "ringtrain/cp/zigzag.h"

namespace ringtrain::cp {

void allgather_attention_forward(comm::Communicator& comm, const attention::AttnParams& local,
                                 const attention::AttnForwardArgs& a, int64_t global_len);
void allgather_attention_backward(comm::Communicator& comm, const attention::AttnParams& local,
                                  const attention::AttnBackwardArgs& a, int64_t global_len);
// Packed documents (THD, local.packed) in one all-gather and one reduce-scatter for all of them.
void allgather_packed_attention_forward(comm::Communicator& comm, const attention::AttnParams& local,
                                        const attention::AttnForwardArgs& a, const PackedZigzag& layout);
void allgather_packed_attention_backward(comm::Communicator& comm, const attention::AttnParams& local,
                                         const attention::AttnBackwardArgs& a, const PackedZigzag& layout);

}  // namespace ringtrain::cp
