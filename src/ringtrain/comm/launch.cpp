#include "ringtrain/comm/launch.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "ringtrain/comm/communicator.h"
#include "ringtrain/core/error.h"

namespace ringtrain::comm {
namespace {

// Returns the child's pid, or -1 with errno set when fork fails.
pid_t spawn(const LaunchOptions& o, int rank, const std::vector<std::string>& argv) {
  const pid_t launcher = ::getpid();
  const pid_t pid = ::fork();
  if (pid != 0) {
    // (also in the child: whichever runs first) so that a rank's own children are stopped too
    if (pid > 0) ::setpgid(pid, pid);
    return pid;
  }
  ::setpgid(0, 0);
  // A launcher killed with SIGKILL cannot stop its ranks; the kernel does it for the rank itself. The launcher may
  // have died before the request took effect, hence the check of the parent.
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != launcher) ::_exit(128 + SIGKILL);
  // Child: its own variables, then exec.
  const std::string r = std::to_string(rank), w = std::to_string(o.nproc), port = std::to_string(o.master_port);
  ::setenv("RANK", r.c_str(), 1);
  ::setenv("LOCAL_RANK", r.c_str(), 1);
  ::setenv("WORLD_SIZE", w.c_str(), 1);
  ::setenv("LOCAL_WORLD_SIZE", w.c_str(), 1);
  ::setenv("MASTER_ADDR", o.master_addr.c_str(), 1);
  ::setenv("MASTER_PORT", port.c_str(), 1);
  ::setenv("NCCL_NVLS_ENABLE", "0", 1);  // NVLink multicast stays off (it can take a shared host's GPUs down)
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  ::execvp(args[0], args.data());
  std::fprintf(stderr, "ringtrain launch: rank %d: cannot run '%s': %s\n", rank, args[0], std::strerror(errno));
  ::_exit(127);
}

// Set by SIGTERM/SIGINT/SIGHUP while ranks run: the launcher then stops them (each rank is its own process group,
// so a signal to the launcher alone would leave them running).
volatile sig_atomic_t g_stop_signal = 0, g_stop_signals = 0;
void on_stop_signal(int sig) {
  if (g_stop_signal == 0) g_stop_signal = sig;
  if (g_stop_signals < 2) g_stop_signals = g_stop_signals + 1;
}

int exit_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// Stops the ranks started so far (their whole process groups) and waits for them.
void kill_and_reap(const std::vector<pid_t>& pids) {
  for (pid_t p : pids) ::kill(-p, SIGKILL);
  for (pid_t p : pids)
    while (::waitpid(p, nullptr, 0) < 0 && errno == EINTR) {
    }
}

// A signal the launcher was started ignoring stays ignored (`nohup ringtrain launch ...` must outlive its terminal).
void take_unless_ignored(int sig, const struct sigaction& sa, struct sigaction& old) {
  ::sigaction(sig, nullptr, &old);
  if (old.sa_handler != SIG_IGN) ::sigaction(sig, &sa, nullptr);
}

void restore_handlers(const struct sigaction& term, const struct sigaction& intr, const struct sigaction& hup) {
  ::sigaction(SIGTERM, &term, nullptr);
  ::sigaction(SIGINT, &intr, nullptr);
  ::sigaction(SIGHUP, &hup, nullptr);
}

}  // namespace

LaunchResult launch_local(const LaunchOptions& o, const std::vector<std::string>& argv) {
  // comm::kMaxRanks: more ranks than any node has GPUs; beyond it a typo would fork thousands of processes.
  RT_CHECK(o.nproc >= 1 && o.nproc <= kMaxRanks, "launch: --nproc must be in [1, ", kMaxRanks, "], got ", o.nproc);
  RT_CHECK(!argv.empty(), "launch: no command given (usage: ringtrain launch --nproc N -- COMMAND ...)");
  struct sigaction sa {}, old_term {}, old_int {}, old_hup {};
  sa.sa_handler = on_stop_signal;
  take_unless_ignored(SIGTERM, sa, old_term);
  take_unless_ignored(SIGINT, sa, old_int);
  take_unless_ignored(SIGHUP, sa, old_hup);
  g_stop_signal = 0;
  g_stop_signals = 0;
  // Each rank's leader, also its process group. A reaped leader's group is still signalled: a rank that failed first
  // may leave children of its own (a wrapper script's worker), which the stop must reach too.
  std::vector<pid_t> pids;
  const auto signal_groups = [&](int sig) {
    for (pid_t g : pids) ::kill(-g, sig);
  };
  for (int r = 0; r < o.nproc; ++r) {
    const pid_t pid = spawn(o, r, argv);
    if (pid < 0) {
      const int err = errno;
      kill_and_reap(pids);
      restore_handlers(old_term, old_int, old_hup);
      throw Error(cat("launch: cannot start rank ", r, " of ", o.nproc, " (fork: ", std::strerror(err),
                      "); the started ranks were stopped"));
    }
    pids.push_back(pid);
  }
  LaunchResult result;
  int running = o.nproc;
  bool terminating = false, signalled = false, killed = false;
  auto kill_after = std::chrono::steady_clock::time_point::max();
  while (running > 0) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid == 0) {
      if (g_stop_signal && !signalled) {
        std::fprintf(stderr, "ringtrain launch: signal %d; stopping the ranks (a second signal kills them at once)\n",
                     static_cast<int>(g_stop_signal));
        // A rank that failed first keeps its exit code, but the user's interrupt is still what the launcher ends by.
        if (!terminating) result.code = 128 + g_stop_signal;
        result.signal = g_stop_signal;
        terminating = signalled = true;
        signal_groups(SIGTERM);
        kill_after = std::min(kill_after, std::chrono::steady_clock::now() + o.stop_grace);
      }
      if (!killed && ((terminating && std::chrono::steady_clock::now() >= kill_after) || g_stop_signals >= 2)) {
        signal_groups(SIGKILL);
        killed = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    if (pid < 0) break;
    int rank = -1;
    for (int r = 0; r < o.nproc; ++r)
      if (pids[r] == pid) rank = r;
    if (rank < 0) continue;
    --running;
    const int code = exit_code(status);
    if (code != 0 && !terminating) {
      // A rank killed by a signal gives 128 + its number, as a shell reports it; the message names the signal, so
      // that a crashed rank is not taken for a crashed launcher.
      const std::string how = WIFSIGNALED(status) ? cat("killed by signal ", WTERMSIG(status), " (",
                                                        ::strsignal(WTERMSIG(status)), "), exit code ", code)
                                                  : cat("exit code ", code);
      std::fprintf(stderr, "ringtrain launch: rank %d failed (%s); stopping the other ranks\n", rank, how.c_str());
      result = {code, 0};
      terminating = true;
      signal_groups(SIGTERM);
      kill_after = std::chrono::steady_clock::now() + o.grace;
    }
  }
  if (terminating) {
    // The leaders are gone; what is left of their groups gets the rest of the same grace, then SIGKILL.
    const auto alive = [&] {
      return std::any_of(pids.begin(), pids.end(), [](pid_t g) { return ::kill(-g, 0) == 0; });
    };
    while (!killed && alive() && std::chrono::steady_clock::now() < kill_after)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    signal_groups(SIGKILL);
  }
  restore_handlers(old_term, old_int, old_hup);
  return result;
}

}  // namespace ringtrain::comm
