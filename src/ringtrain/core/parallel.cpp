#include "ringtrain/core/parallel.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>

namespace ringtrain {
namespace {

// True on the pool's workers and on a thread while it runs a loop on the pool: a parallel_for inside one runs
// serially (the pool is taken, and a worker waiting for the pool would wait for itself).
thread_local bool t_inside_pool = false;

// One loop's items, handed out one at a time to the caller and the workers.
struct Loop {
  const std::function<void(int64_t)>* fn = nullptr;
  int64_t n = 0;
  std::atomic<int64_t> next{0};
  std::mutex error_mu;
  std::exception_ptr error;

  void work() {
    for (int64_t i; (i = next.fetch_add(1)) < n;) {
      try {
        (*fn)(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (!error) error = std::current_exception();
        next = n;
      }
    }
  }
};

// Worker threads started once and kept: a loop costs a wake-up of each, not a thread start and join (which on a small
// model's many short loops cost more than the loops).
class Pool {
 public:
  explicit Pool(int workers) : owner_(::getpid()) {
    for (int t = 0; t < workers; ++t) {
      try {
        std::thread([this] { serve(); }).detach();
      } catch (const std::exception&) {
        break;  // no more threads to be had (a process limit, memory): the loops run with those there are
      }
    }
  }

  // Runs the loop on this thread and the workers. False, with nothing run, when another thread's loop holds the pool
  // (in-process ranks are threads of their own already) or in a child forked from the process that made the pool
  // (its workers are not there).
  bool run(int64_t n, const std::function<void(int64_t)>& fn) {
    if (::getpid() != owner_) return false;
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    Loop loop;
    loop.fn = &fn, loop.n = n;
    {
      std::lock_guard<std::mutex> lock(mu_);
      loop_ = &loop;
      ++generation_;
    }
    wake_.notify_all();
    t_inside_pool = true;
    loop.work();
    t_inside_pool = false;
    {
      // No worker takes the loop after this; those inside it finish their items.
      std::unique_lock<std::mutex> lock(mu_);
      loop_ = nullptr;
      idle_.wait(lock, [&] { return inside_ == 0; });
    }
    if (loop.error) std::rethrow_exception(loop.error);
    return true;
  }

 private:
  void serve() {
    t_inside_pool = true;
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      wake_.wait(lock, [&] { return generation_ != seen; });
      seen = generation_;
      Loop* loop = loop_;
      if (!loop) continue;  // woken after that loop ended
      ++inside_;
      lock.unlock();
      loop->work();
      lock.lock();
      if (--inside_ == 0) idle_.notify_all();
    }
  }

  const pid_t owner_;
  std::mutex busy_;  // held by the thread whose loop runs
  std::mutex mu_;
  std::condition_variable wake_, idle_;
  Loop* loop_ = nullptr;
  uint64_t generation_ = 0;
  int inside_ = 0;  // workers inside loop_
};

// Made at the first parallel loop and never destroyed: its workers may be inside a loop while the process exits.
Pool& pool() {
  static Pool* p = new Pool(host_threads() - 1);
  return *p;
}

}  // namespace

int host_threads() {
  static const int n = [] {
    if (const char* s = std::getenv("RINGTRAIN_HOST_THREADS")) {
      int v = std::atoi(s);
      if (v > 0) return v;
    }
    return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  }();
  return n;
}

void parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n > 1 && host_threads() > 1 && !t_inside_pool && pool().run(n, fn)) return;
  for (int64_t i = 0; i < n; ++i) fn(i);
}

}  // namespace ringtrain
