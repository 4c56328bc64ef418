// The NCCL communicator: one process per GPU. Buffers are device memory of this rank's GPU.
//
// With a `stream`, an operation is enqueued on it and the call returns once NCCL accepted it (the stream orders
// what follows); without one, it starts after the work already on the legacy default stream (the buffers'
// producers) and runs on the communicator's own stream: collectives return when complete, send_recv at once. send_recv's Request::wait()
// blocks the host until the exchange completes. Every host wait polls with a deadline (the timeout): when it
// passes, or NCCL reports an asynchronous error (a peer died), the communicator is aborted (ncclCommAbort) and
// a CommError names the operation and the ranks — never a hang.
#pragma once

#include <chrono>
#include <memory>

#include "ringtrain/comm/communicator.h"
#include "ringtrain/comm/rendezvous.h"

namespace ringtrain::comm {

// Creates this process's communicator: GPU = local_rank, the NCCL unique id passed from rank 0 through the TCP
// rendezvous (rendezvous.h). NCCL_NVLS_ENABLE=0 is forced (NVLink multicast stays off).
std::unique_ptr<Communicator> make_nccl_communicator(const RankInfo& info, std::chrono::milliseconds timeout);

}  // namespace ringtrain::comm
