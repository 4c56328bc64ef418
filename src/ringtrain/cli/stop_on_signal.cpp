#include "ringtrain/cli/stop_on_signal.h"

#include <csignal>
#include <cstdio>
#include <cstring>  // sigabbrev_np

#include "ringtrain/cli/commands.h"
#include "ringtrain/comm/agreed.h"
#include "ringtrain/core/error.h"

namespace ringtrain::cli {
namespace {

StopRequest g_request;
volatile std::sig_atomic_t g_signal = 0;
bool g_installed = false;
struct sigaction g_old_int {}, g_old_term {};

void on_signal(int sig) {
  if (g_signal == 0) g_signal = sig;
  g_request.request();
}

}  // namespace

StopOnSignal::StopOnSignal() {
  RT_CHECK(!g_installed, "StopOnSignal: one at a time");
  g_request.clear();
  g_signal = 0;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND;  // the second signal takes the default action: the process ends at once
  ::sigaction(SIGINT, &sa, &g_old_int);
  ::sigaction(SIGTERM, &sa, &g_old_term);
  g_installed = true;
}

StopOnSignal::~StopOnSignal() {
  ::sigaction(SIGINT, &g_old_int, nullptr);
  ::sigaction(SIGTERM, &g_old_term, nullptr);
  g_installed = false;
}

const StopRequest* StopOnSignal::request() const { return &g_request; }

int StopOnSignal::signal() const { return g_signal; }

void run_stoppable(const char* command, const std::function<void(const StopRequest*)>& work) {
  StopOnSignal stop;
  try {
    work(stop.request());
  } catch (const comm::Interrupted&) {
    // A rank may stop because another one saw the signal; it then names none of its own.
    const int sig = stop.signal();
    const char* name = sig != 0 ? sigabbrev_np(sig) : nullptr;
    std::fprintf(stderr, "ringtrain %s: stopped by %s\n", command,
                 name ? cat("SIG", name).c_str() : "a signal to another rank");
    if (sig == 0) throw Exit{128 + SIGTERM};
    throw Exit{128 + sig};
  }
}

}  // namespace ringtrain::cli
