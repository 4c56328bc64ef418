#include "ctrl_c.h"

#include <atomic>

#include <pybind11/pybind11.h>

namespace py = pybind11;

namespace ringtrain::python {
namespace {

// The stop request of the main thread's call in progress.
std::atomic<StopRequest*> sigint_target{nullptr};
static_assert(std::atomic<StopRequest*>::is_always_lock_free, "the signal handler reads it");

// The handler a call replaced, while sigint_target is set.
struct sigaction replaced_sigint {};

extern "C" void request_stop_on_sigint(int) {
  if (StopRequest* stop = sigint_target.load()) stop->request();
}

}  // namespace

bool python_takes_sigint_here() {
  const py::module_ threading = py::module_::import("threading");
  if (!threading.attr("current_thread")().is(threading.attr("main_thread")())) return false;
  const py::module_ signal = py::module_::import("signal");
  return signal.attr("getsignal")(signal.attr("SIGINT")).is(signal.attr("default_int_handler"));
}

SigintToStop::SigintToStop(StopRequest& stop, bool take, bool& caught) : stop_(stop), caught_(caught) {
  caught_ = false;
  if (!take) return;
  stop_.clear();
  struct sigaction ours {};
  ours.sa_handler = request_stop_on_sigint;
  sigemptyset(&ours.sa_mask);
  ours.sa_flags = SA_RESTART;
  sigint_target.store(&stop_);
  if (::sigaction(SIGINT, &ours, &previous_) != 0) {
    sigint_target.store(nullptr);
    return;  // Python's handler stays: Ctrl-C then waits for the call
  }
  replaced_sigint = previous_;
  taken_ = true;
}

void give_sigint_back_after_fork() {
  if (!sigint_target.load()) return;
  ::sigaction(SIGINT, &replaced_sigint, nullptr);
  sigint_target.store(nullptr);
}

SigintToStop::~SigintToStop() {
  if (!taken_) return;
  ::sigaction(SIGINT, &previous_, nullptr);
  sigint_target.store(nullptr);
  caught_ = stop_.requested();
  stop_.clear();
}

}  // namespace ringtrain::python
