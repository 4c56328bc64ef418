// Ring attention with pass-KV over the zigzag layout. Use through cp/cp_attention.h.
#pragma once

#include "ringtrain/attention/params.h"
#include "ringtrain/comm/communicator.h"
#include "ringtrain/cp/cp_attention.h"
#include "ringtrain/cp/zigzag.h"

namespace ringtrain::cp {

void ring_attention_forward(comm::Communicator& comm, const attention::AttnParams& local,
                            const attention::AttnForwardArgs& a, int64_t global_len, KeptKv* kept);
void ring_attention_backward(comm::Communicator& comm, const attention::AttnParams& local,
                             const attention::AttnBackwardArgs& a, int64_t global_len, KeptKv* kept);
// Packed documents (THD, local.packed) in one ring: every step exchanges the rank's rows of all documents at once.
void ring_packed_attention_forward(comm::Communicator& comm, const attention::AttnParams& local,
                                   const attention::AttnForwardArgs& a, const PackedZigzag& layout);
void ring_packed_attention_backward(comm::Communicator& comm, const attention::AttnParams& local,
                                    const attention::AttnBackwardArgs& a, const PackedZigzag& layout);

}  // namespace ringtrain::cp
