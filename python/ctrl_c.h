// Ctrl-C during a long call of the Python module. Python runs its SIGINT handler only between bytecodes of the main
// thread, so a call that spends minutes in C++ would ignore Ctrl-C until it returned. While a call made on the main
// thread runs, and Python's own handler (signal.default_int_handler) is the one in place, SIGINT instead requests a
// stop of that call (StopRequest): it ends at its next safe point, every rank together (comm::Interrupted, raised
// as KeyboardInterrupt), having changed no weight. A SIGINT that comes too late to stop the call is handed to
// Python when the call returns, so it raises KeyboardInterrupt there, as Python would have. A handler of the
// user's own is left alone: it runs when the call returns.
#pragma once

#include <csignal>

#include "ringtrain/core/stop_request.h"

namespace ringtrain::python {

class CtrlC {
 public:
  // With the GIL held: where Python's SIGINT handling applies to this call, clears `stop` and takes SIGINT.
  explicit CtrlC(StopRequest& stop);
  // With the GIL held: gives SIGINT back (a SIGINT that came and was not consumed is passed on to Python) and clears
  // `stop`.
  ~CtrlC();
  CtrlC(const CtrlC&) = delete;
  CtrlC& operator=(const CtrlC&) = delete;

  // The call stopped because of the SIGINT: the caller raises KeyboardInterrupt itself.
  void consumed() { consumed_ = true; }

 private:
  StopRequest& stop_;
  bool taken_ = false, consumed_ = false;
  struct sigaction previous_ {};
};

}  // namespace ringtrain::python
