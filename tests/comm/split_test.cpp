// Sub-groups of the in-process communicator: the ranks and sizes a split gives, collectives inside every sub-group
// against a direct sum of the members' fresh random data (interleaved with the parent's), nested splits, and the
// failure paths: a bad color is named, and a rank failing in one group fails a wait in another group fast.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "ringtrain/comm/in_process.h"
#include "test_util.h"

namespace ringtrain {
namespace {

using comm::CommError;
using comm::Communicator;
using comm::ReduceOp;
using namespace std::chrono_literals;

// Every rank's data, computable by every rank: a fresh seed (the same on all ranks) and the rank.
std::vector<double> rank_values(uint64_t seed, int world_rank, size_t n) {
  std::mt19937_64 rng(seed * 7919 + world_rank);
  std::normal_distribution<double> d;
  std::vector<double> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::string run_and_catch(int world, std::chrono::milliseconds timeout, const std::function<void(Communicator&)>& fn) {
  try {
    comm::run_ranks(world, timeout, fn);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// A 2 × 3 grid: row groups (3 adjacent ranks) and column groups (2 ranks, ordered by a reversed key).
TEST(InProcessSplit, GridGroupsReduceTheirMembers) {
  const int rows = 2, cols = 3, world = rows * cols;
  const uint64_t seed = testing::fresh_seed();
  const size_t n = 37;
  comm::run_ranks(world, 10s, [&](Communicator& c) {
    const int r = c.rank();
    auto row = c.split(r / cols, r % cols);
    auto col = c.split(r % cols, -r);  // a larger world rank comes first
    ASSERT_EQ(row->size(), cols);
    ASSERT_EQ(row->rank(), r % cols);
    ASSERT_EQ(col->size(), rows);
    ASSERT_EQ(col->rank(), rows - 1 - r / cols);
    EXPECT_EQ(row->timeout(), c.timeout());

    for (int round = 0; round < 3; ++round) {  // interleaved with the parent's collectives
      std::vector<double> mine = rank_values(seed + round, r, n), row_sum(n), col_sum(n), world_sum(n);
      for (int q = 0; q < world; ++q) {
        const std::vector<double> v = rank_values(seed + round, q, n);
        for (size_t i = 0; i < n; ++i) {
          if (q / cols == r / cols) row_sum[i] += v[i];
          if (q % cols == r % cols) col_sum[i] += v[i];
          world_sum[i] += v[i];
        }
      }
      std::vector<double> a = mine, b = mine, w = mine;
      row->all_reduce(a.data(), n, DType::F64, ReduceOp::Sum);
      c.all_reduce(w.data(), n, DType::F64, ReduceOp::Sum);
      col->all_reduce(b.data(), n, DType::F64, ReduceOp::Sum);
      for (size_t i = 0; i < n; ++i) {
        // Sums of at most 6 normal values in a fixed order: a few ulps of the largest partial sum.
        EXPECT_NEAR(a[i], row_sum[i], 1e-13) << "row group, element " << i;
        EXPECT_NEAR(b[i], col_sum[i], 1e-13) << "column group, element " << i;
        EXPECT_NEAR(w[i], world_sum[i], 1e-13) << "world, element " << i;
      }
    }
    // all_gather in the column group: blocks in the group's rank order (descending world rank).
    double mine = r, got[2] = {-1, -1};
    col->all_gather(&mine, got, 1, DType::F64);
    EXPECT_EQ(got[0], (rows - 1) * cols + r % cols);
    EXPECT_EQ(got[1], r % cols);
  });
}

TEST(InProcessSplit, NestedAndSingleRankGroups) {
  comm::run_ranks(4, 10s, [&](Communicator& c) {
    auto half = c.split(c.rank() / 2, c.rank());
    auto alone = half->split(half->rank(), 0);  // every rank alone
    EXPECT_EQ(alone->size(), 1);
    EXPECT_EQ(alone->rank(), 0);
    int32_t x = 5 + c.rank();
    alone->all_reduce(&x, 1, DType::I32, ReduceOp::Sum);
    EXPECT_EQ(x, 5 + c.rank());
    auto again = half->split(0, 0);  // the same members again: a new group, ordered by rank
    int32_t y = c.rank();
    again->all_reduce(&y, 1, DType::I32, ReduceOp::Max);
    EXPECT_EQ(y, c.rank() / 2 * 2 + 1);
  });
}

TEST(InProcessSplit, NegativeColorIsNamed) {
  const std::string root = run_and_catch(3, 5s, [&](Communicator& c) { c.split(c.rank() == 1 ? -2 : 0, 0); });
  EXPECT_NE(root.find("rank 1 passed color -2"), std::string::npos) << root;
}

// World 4 as cp groups {0,1}, {2,3}. Rank 3 throws; rank 0 waits in its cp group for rank 1, which is busy and
// healthy: rank 0 must still fail fast, naming rank 3, because the groups are one failure domain.
TEST(InProcessSplit, FailureInOneGroupFailsAWaitInAnotherFast) {
  const auto timeout = 5000ms;
  std::atomic<bool> stop{false};
  double elapsed_ms = -1;
  std::string seen;
  const std::string root = run_and_catch(4, timeout, [&](Communicator& c) {
    auto cp = c.split(c.rank() / 2, c.rank());
    const auto start = std::chrono::steady_clock::now();
    if (c.rank() == 3) {
      std::this_thread::sleep_for(50ms);
      throw Error("boom: bad batch on rank 3");
    }
    if (c.rank() == 1) {
      while (!stop) std::this_thread::sleep_for(5ms);
      return;
    }
    float x = 1;
    try {
      cp->all_reduce(&x, 1, DType::F32, ReduceOp::Sum);
    } catch (const CommError& e) {
      if (c.rank() == 0) {
        elapsed_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
        seen = e.what();
        stop = true;
      }
      throw;
    }
  });
  stop = true;
  EXPECT_NE(root.find("boom: bad batch on rank 3"), std::string::npos) << "the root cause must win: " << root;
  EXPECT_NE(seen.find("world rank 3 failed in another group: boom"), std::string::npos) << seen;
  EXPECT_GE(elapsed_ms, 0);
  EXPECT_LT(elapsed_ms, 1000) << "rank 0 waited " << elapsed_ms << " ms with a 5000 ms timeout";
}

}  // namespace
}  // namespace ringtrain
