#include "ringtrain/core/parallel.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace ringtrain {

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
  const int64_t workers = std::min<int64_t>(n, host_threads());
  if (workers <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::mutex mu;
  auto body = [&] {
    for (int64_t i; (i = next.fetch_add(1)) < n;) {
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
        next = n;
      }
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(workers - 1));  // emplace_back below never reallocates
  for (int64_t t = 1; t < workers; ++t) {
    try {
      threads.emplace_back(body);
    } catch (const std::exception&) {
      break;  // no more threads to be had (a process limit, memory): the started ones and this one share the work
    }
  }
  body();
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace ringtrain
