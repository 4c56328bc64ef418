// Errors that a whole group agrees on, so that a failure on some ranks leaves every rank in step.
#pragma once

#include <functional>
#include <string>

#include "ringtrain/comm/communicator.h"

namespace ringtrain::comm {

// Runs f on every rank of `world`; when it throws anywhere, every rank throws the error of the lowest failing rank
// (sent to all, so that each process's log names the cause) as an AgreedError. Costs one all-reduce of one integer
// when no rank fails, nothing with one rank.
void all_or_none(Communicator& world, const std::string& what, const std::function<void()>& f);

}  // namespace ringtrain::comm
