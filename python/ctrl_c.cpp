#include "ctrl_c.h"

#include <atomic>

#include <pybind11/pybind11.h>

#include "ringtrain/core/error.h"

namespace py = pybind11;

namespace ringtrain::python {
namespace {

// The stop request of the main thread's call in progress; calls from other threads never take SIGINT.
std::atomic<StopRequest*> sigint_target{nullptr};
static_assert(std::atomic<StopRequest*>::is_always_lock_free, "the signal handler reads it");

extern "C" void request_stop_on_sigint(int) {
  if (StopRequest* stop = sigint_target.load()) stop->request();
}

// Whether SIGINT would reach this call through Python: the main thread, with Python's default handler.
bool python_handles_sigint_here() {
  const py::module_ threading = py::module_::import("threading");
  if (!threading.attr("current_thread")().is(threading.attr("main_thread")())) return false;
  const py::module_ signal = py::module_::import("signal");
  return signal.attr("getsignal")(signal.attr("SIGINT")).is(signal.attr("default_int_handler"));
}

}  // namespace

CtrlC::CtrlC(StopRequest& stop) : stop_(stop) {
  if (!python_handles_sigint_here()) return;
  stop_.clear();
  struct sigaction ours {};
  ours.sa_handler = request_stop_on_sigint;
  sigemptyset(&ours.sa_mask);
  ours.sa_flags = SA_RESTART;
  sigint_target.store(&stop_);
  if (::sigaction(SIGINT, &ours, &previous_) != 0) {
    sigint_target.store(nullptr);
    return;  // Python's handler stays: Ctrl-C then waits for the call, as before
  }
  taken_ = true;
}

CtrlC::~CtrlC() {
  if (!taken_) return;
  ::sigaction(SIGINT, &previous_, nullptr);
  sigint_target.store(nullptr);
  if (stop_.requested() && !consumed_) PyErr_SetInterrupt();
  stop_.clear();
}

}  // namespace ringtrain::python
