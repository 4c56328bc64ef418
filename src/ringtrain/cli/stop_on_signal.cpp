#include "ringtrain/cli/stop_on_signal.h"

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>  // sigabbrev_np
#include <ctime>
#include <string>

#include <unistd.h>

#include "ringtrain/cli/commands.h"
#include "ringtrain/comm/agreed.h"
#include "ringtrain/comm/rendezvous.h"
#include "ringtrain/core/error.h"

namespace ringtrain::cli {
namespace {

// A repeat this soon after the first signal is the same request delivered twice: a terminal's Ctrl-C reaches every
// process of torchrun's group, and torchrun then forwards a signal of its own to each.
constexpr int64_t kRepeatWindowNs = 2'000'000'000;

StopRequest g_request;
// Threads of a process take signals concurrently, so the first signal is the one whose time lands in g_first_ns.
std::atomic<int64_t> g_first_ns{0};
std::atomic<int> g_signal{0};
static_assert(std::atomic<int64_t>::is_always_lock_free && std::atomic<int>::is_always_lock_free,
              "a signal handler uses them");
bool g_installed = false;
struct sigaction g_old_int {}, g_old_term {};
std::string g_announcement;  // written by the constructor before the handler is installed, read by the handler only

void say(const char* text) {
  for (size_t left = std::strlen(text); left > 0;) {  // write(2) is async-signal-safe; stdio is not
    const ssize_t n = ::write(STDERR_FILENO, text, left);
    if (n <= 0) return;
    text += n, left -= static_cast<size_t>(n);
  }
}

int64_t monotonic_ns() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);  // async-signal-safe
  return int64_t(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

void on_signal(int sig) {
  const int64_t now = monotonic_ns();
  int64_t first = 0;
  if (g_first_ns.compare_exchange_strong(first, now)) {
    g_signal.store(sig);
    g_request.request();  // after g_signal, which the run reads once it has stopped
    if (!g_announcement.empty()) {
      say(sig == SIGINT ? "\nSIGINT: " : "\nSIGTERM: ");
      say(g_announcement.c_str());
    }
    return;
  }
  if (now - first < kRepeatWindowNs) return;
  ::signal(sig, SIG_DFL);  // the default action ends the process, as if nothing had caught the signal
  ::raise(sig);
}

}  // namespace

StopOnSignal::StopOnSignal(std::string announcement) {
  RT_CHECK(!g_installed, "StopOnSignal: one at a time");
  // The other ranks of a multi-process run (torchrun, mpirun, srun) stay quiet; variables that do not parse are the
  // launcher check's to report, so this process speaks.
  bool lead = true;
  try {
    lead = comm::rank_info_from_environment().rank == 0;
  } catch (const Error&) {
  }
  g_announcement = lead ? std::move(announcement) : std::string();
  g_request.clear();
  g_signal.store(0);
  g_first_ns.store(0);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaddset(&sa.sa_mask, SIGINT);
  sigaddset(&sa.sa_mask, SIGTERM);
  // A signal that the process was started ignoring (`nohup`, a background job of a script) stays ignored.
  ::sigaction(SIGINT, nullptr, &g_old_int);
  ::sigaction(SIGTERM, nullptr, &g_old_term);
  if (g_old_int.sa_handler != SIG_IGN) ::sigaction(SIGINT, &sa, nullptr);
  if (g_old_term.sa_handler != SIG_IGN) ::sigaction(SIGTERM, &sa, nullptr);
  g_installed = true;
}

StopOnSignal::~StopOnSignal() {
  ::sigaction(SIGINT, &g_old_int, nullptr);
  ::sigaction(SIGTERM, &g_old_term, nullptr);
  g_installed = false;
}

const StopRequest* StopOnSignal::request() const { return &g_request; }

int StopOnSignal::signal() const { return g_signal.load(); }

void run_stoppable(const char* command, const char* then, const std::function<void(const StopRequest*)>& work) {
  StopOnSignal stop(cat("ringtrain ", command, " stops at its next microbatch, every rank together, then ", then,
                        "; another signal 2 s or more from now ends it at once\n"));
  const auto signal_name = [](int sig) { return cat("SIG", sigabbrev_np(sig) ? sigabbrev_np(sig) : "?"); };
  try {
    work(stop.request());
  } catch (const comm::Interrupted&) {
    // A rank may stop because another one saw the signal; it then has none of its own to end by.
    const int sig = stop.signal();
    std::fprintf(stderr, "ringtrain %s: stopped by %s\n", command,
                 sig != 0 ? signal_name(sig).c_str() : "a signal to another rank");
    throw Exit{128 + (sig != 0 ? sig : SIGTERM), sig};
  }
  if (const int sig = stop.signal(); sig != 0) {
    std::fprintf(stderr, "ringtrain %s: %s came after the last point where the run could stop: the run is complete\n",
                 command, signal_name(sig).c_str());
    throw Exit{128 + sig, sig};
  }
}

}  // namespace ringtrain::cli
