// Ring attention with pass-KV over the zigzag layout. Use through cp/cp_attention.h.
#pragma once

#include "ringtrain/attention/params.h"
#include "ringtrain/comm/communicator.h"
#include "ringtrain/cp/cp_attention.h"

namespace ringtrain::cp {

void ring_attention_forward(comm::Communicator& comm, const attention::AttnParams& local,
                            const attention::AttnForwardArgs& a, int64_t global_len, KeptKv* kept);
void ring_attention_backward(comm::Communicator& comm, const attention::AttnParams& local,
                             const attention::AttnBackwardArgs& a, int64_t global_len, KeptKv* kept);

}  // namespace ringtrain::cp
