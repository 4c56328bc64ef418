// Errors that a whole group agrees on, so that a failure on some ranks leaves every rank in step.
#pragma once

#include <functional>
#include <string>

#include "ringtrain/comm/communicator.h"
#include "ringtrain/core/stop_request.h"

namespace ringtrain::comm {

// Runs f on every rank of `world`; when it throws anywhere, every rank throws the error of the lowest failing rank
// (sent to all, so that each process's log names the cause) as an AgreedError. Costs one all-reduce of one integer
// when no rank fails, nothing with one rank.
void all_or_none(Communicator& world, const std::string& what, const std::function<void()>& f);

// A call that every rank stopped at the same safe point because a stop was requested on one of them: no state was
// changed by it, and the group is in step.
class Interrupted : public AgreedError {
 public:
  using AgreedError::AgreedError;
};

// Whether a stop was requested on any rank of `group`: the same answer on every rank. stop must be null on every
// rank or on none; with null, or with one rank, nothing is exchanged (otherwise one all-reduce of one integer).
bool any_stop_requested(Communicator& group, const StopRequest* stop);
// Throws Interrupted("`what` was interrupted") on every rank of `world` when any rank either stopped earlier (`stopped`)
// or has a stop requested now.
void agree_to_stop(Communicator& world, const StopRequest* stop, bool stopped, const std::string& what);

}  // namespace ringtrain::comm
