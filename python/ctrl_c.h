// Ctrl-C during a long call of the Python module. Python runs its SIGINT handler only between bytecodes of the main
// thread, so a call that spends minutes in C++ would ignore Ctrl-C until it returned. While a call made on the main
// thread runs (holding its worker), and Python's own handler (signal.default_int_handler) is the one in place, SIGINT
// instead requests a stop of that call (StopRequest): it ends at its next safe point, every rank together
// (comm::Interrupted, raised as KeyboardInterrupt), having changed no weight. A SIGINT that came too late to stop the
// call is the caller's to hand on (module.cpp). A handler of the user's own is left alone: it runs when the call
// returns.
#pragma once

#include <csignal>

#include "ringtrain/core/stop_request.h"

namespace ringtrain::python {

// Whether SIGINT would reach a call made now through Python's default handler: the main thread, with that handler
// in place. Needs the GIL.
bool python_takes_sigint_here();

// While it lives, when `take`, SIGINT sets `stop` instead of reaching Python. Construct it once the call holds its
// worker, so that only that call is stopped; needs no GIL. On destruction SIGINT goes back to Python's handler,
// `caught` says whether a SIGINT came, and `stop` is cleared before the worker is released.
class SigintToStop {
 public:
  SigintToStop(StopRequest& stop, bool take, bool& caught);
  ~SigintToStop();
  SigintToStop(const SigintToStop&) = delete;
  SigintToStop& operator=(const SigintToStop&) = delete;

 private:
  StopRequest& stop_;
  bool& caught_;
  bool taken_ = false;
  struct sigaction previous_ {};
};

// In the child of a fork made while a call of the main thread held SIGINT (the parent's other thread forked): the
// SIGINT handler the call replaced is put back, so that Ctrl-C reaches the child's Python.
void give_sigint_back_after_fork();

}  // namespace ringtrain::python
