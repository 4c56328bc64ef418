// The in-process communicator: every rank is a thread of this process and buffers are host memory.
// It serves tests and the CPU attention check, and is the reference for the semantics of Communicator
// (collective order, timeouts, fail-fast on a peer's failure) that the NCCL communicator must match.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <vector>

#include "ringtrain/comm/communicator.h"

namespace ringtrain::comm {

// One communicator per rank of a new group of `world` ranks sharing state; rank r is element r.
std::vector<std::unique_ptr<Communicator>> make_in_process_group(int world, std::chrono::milliseconds timeout);

// Runs fn(r) on one thread per communicator of `comms` (its rank r in that vector) and joins them; returns each
// rank's exception (nullptr where none). A rank whose fn throws aborts its communicator, so that the others fail
// fast. A thread that cannot be started (a process limit, memory) aborts the group, and the started ranks are
// joined before Error is thrown.
std::vector<std::exception_ptr> run_threads(const std::vector<std::unique_ptr<Communicator>>& comms,
                                            const std::function<void(int)>& fn);

// Runs fn on `world` threads, one rank each. When a rank's fn throws, its communicator is aborted so that the
// others fail fast; after joining all threads the root-cause error (the first failure in time, not the
// "rank X failed" errors it caused elsewhere) is rethrown with its rank named: CommError stays CommError,
// anything else becomes ringtrain::Error.
void run_ranks(int world, std::chrono::milliseconds timeout, const std::function<void(Communicator&)>& fn);

}  // namespace ringtrain::comm
