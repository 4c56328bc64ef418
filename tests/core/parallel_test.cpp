// core/parallel.h: every item runs once, on more than one thread where the machine has them; an item's exception
// reaches the caller and leaves the pool usable; loops inside loops, loops of several threads at once and a loop in
// a forked child all finish.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "ringtrain/core/parallel.h"

namespace ringtrain {
namespace {

// Runs fn over n items and returns how many times each ran.
std::vector<int> run_counts(int64_t n) {
  std::vector<std::atomic<int>> counts(static_cast<size_t>(n));
  parallel_for(n, [&](int64_t i) { counts[static_cast<size_t>(i)].fetch_add(1); });
  std::vector<int> out;
  for (auto& c : counts) out.push_back(c.load());
  return out;
}

TEST(ParallelFor, EveryItemRunsOnce) {
  for (const int64_t n : {0, 1, 2, 3, 7, 64, 1000, 100003}) {
    const std::vector<int> counts = run_counts(n);
    ASSERT_EQ(counts.size(), static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(counts[static_cast<size_t>(i)], 1) << "item " << i << " of " << n;
  }
}

TEST(ParallelFor, ItemsShareTheMachinesThreads) {
  if (host_threads() < 2) GTEST_SKIP() << "one host thread (RINGTRAIN_HOST_THREADS or a one-core machine)";
  // Items long enough that the woken workers take some: more than one thread runs them.
  std::mutex mu;
  std::set<std::thread::id> ids;
  parallel_for(16, [&](int64_t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::lock_guard<std::mutex> lock(mu);
    ids.insert(std::this_thread::get_id());
  });
  EXPECT_GE(ids.size(), 2u);
}

TEST(ParallelFor, AnItemsExceptionReachesTheCallerAndThePoolStaysUsable) {
  std::atomic<int> ran{0};
  EXPECT_THROW(parallel_for(1000,
                            [&](int64_t i) {
                              ran.fetch_add(1);
                              if (i == 10) throw std::runtime_error("item 10");
                            }),
               std::runtime_error);
  EXPECT_GE(ran.load(), 1);
  const std::vector<int> counts = run_counts(500);
  for (int c : counts) ASSERT_EQ(c, 1);
}

TEST(ParallelFor, LoopsInsideLoopsAndLoopsOfSeveralThreadsFinish) {
  std::vector<std::atomic<int>> inner(64 * 32);
  parallel_for(64, [&](int64_t i) {
    parallel_for(32, [&](int64_t j) { inner[static_cast<size_t>(i * 32 + j)].fetch_add(1); });
  });
  for (auto& c : inner) ASSERT_EQ(c.load(), 1);

  // In-process ranks are threads that each run loops: whichever holds the pool shares it, the others run theirs alone.
  std::vector<std::thread> ranks;
  std::vector<std::vector<int>> results(4);
  for (size_t r = 0; r < 4; ++r)
    ranks.emplace_back([&, r] {
      for (int round = 0; round < 50; ++round) results[r] = run_counts(257);
    });
  for (auto& t : ranks) t.join();
  for (const auto& counts : results) {
    ASSERT_EQ(counts.size(), 257u);
    for (int c : counts) ASSERT_EQ(c, 1);
  }
}

TEST(ParallelFor, AForkedChildRunsItsLoops) {
  run_counts(100);  // the pool exists in this process
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::alarm(20);  // a child waiting for workers that were not forked would hang: end it instead
    const std::vector<int> counts = run_counts(1000);
    bool ok = counts.size() == 1000;
    for (int c : counts) ok = ok && c == 1;
    ::_exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status)) << "the child ended by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace ringtrain
