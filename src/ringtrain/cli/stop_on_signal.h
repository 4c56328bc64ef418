// Ctrl-C (SIGINT) and SIGTERM (a scheduler's stop, or `ringtrain launch` stopping its ranks) during a training or
// scoring command. The first one asks the run to stop at its next safe point: between microbatches or sampled tokens,
// every rank together (comm/agreed.h), so that no step is half applied and the run can say where it stopped and
// which checkpoint resumes it. One more, two seconds or more after the first, ends the process at once, as the
// signal's default action would; a repeat within those two seconds is the same request delivered twice (torchrun
// forwards a signal to ranks that the terminal's Ctrl-C already reached).
#pragma once

#include <functional>
#include <string>

#include "ringtrain/core/stop_request.h"

namespace ringtrain::cli {

// Holds SIGINT and SIGTERM while it lives (one at a time in a process), except one the process was started ignoring;
// the previous handlers come back after it. Before it (config and data checks), a signal ends the process at once:
// nothing has been written then.
class StopOnSignal {
 public:
  // `announcement`: said on stderr at once when the first signal comes (by rank 0 of a multi-process run), since the
  // stop itself may take a while: the microbatch in progress, then a save.
  explicit StopOnSignal(std::string announcement);
  ~StopOnSignal();
  StopOnSignal(const StopOnSignal&) = delete;
  StopOnSignal& operator=(const StopOnSignal&) = delete;

  const StopRequest* request() const;
  int signal() const;  // the first signal received, 0 while none came
};

// Runs `work` with a StopOnSignal installed and its request passed in; `then` says what the run does once stopped
// (e.g. "saves the steps it finished"). When the run stops at a signal (comm::Interrupted), or the signal came too late
// to stop it, `command` says so and the program ends by that signal (Exit::signal; 128 + its number where it cannot);
// the run itself has said where it stopped.
void run_stoppable(const char* command, const char* then, const std::function<void(const StopRequest*)>& work);

}  // namespace ringtrain::cli
