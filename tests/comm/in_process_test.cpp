// The in-process communicator: every collective against a direct computation on fresh random data, the ring
// exchange, and the failure paths (a throwing rank, a rank that never joins, mismatched calls) that must end
// every rank with a clear CommError within the timeout instead of hanging; an error all ranks agree on
// (all_or_none) leaves the group usable.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <new>
#include <random>
#include <thread>
#include <vector>

#include "ringtrain/comm/agreed.h"
#include "ringtrain/comm/in_process.h"
#include "test_util.h"

namespace ringtrain {
namespace {

using comm::CommError;
using comm::Communicator;
using comm::ReduceOp;
using namespace std::chrono_literals;
using Ms = std::chrono::milliseconds;

// Random host buffers of n elements per rank.
std::vector<Tensor> random_buffers(int world, int64_t n, DType dtype, std::mt19937_64& rng) {
  std::vector<Tensor> out;
  for (int r = 0; r < world; ++r) {
    Tensor t = Tensor::empty({n}, dtype);
    if (is_float(dtype)) {
      testing::fill_normal(t, rng);
    } else {
      std::uniform_int_distribution<int64_t> dist(-1000000, 1000000);
      for (int64_t i = 0; i < n; ++i) store_from_double(t.data(), dtype, i, static_cast<double>(dist(rng)));
    }
    out.push_back(std::move(t));
  }
  return out;
}

std::vector<Tensor> poisoned_buffers(int world, int64_t n, DType dtype) {
  std::vector<Tensor> out;
  for (int r = 0; r < world; ++r) {
    out.push_back(Tensor::empty({n}, dtype));
    if (is_float(dtype)) testing::poison(out.back());
    else fill(out.back(), -7777777);  // integers cannot hold NaN: a value no reduction of the inputs produces
  }
  return out;
}

// Tolerance of a reduction result against the fp64 reference: fp32 sums round after every addition (relative
// error about world * 2^-24 of the magnitude); 16-bit results and the fp64 ones round once like the reference
// does, and max / integer results are exact.
double tolerance(DType dtype, ReduceOp op, int world) {
  if (op == ReduceOp::Max || !is_float(dtype)) return 0;
  if (dtype == DType::F32) return 4.0 * world * 6e-8;
  if (dtype == DType::F64) return 4.0 * world * 1.2e-16;
  return 0;  // bf16/fp16: reduced in fp64 and rounded once, exactly what the reference does
}

double reduce_ref(const std::vector<Tensor>& in, int64_t at, ReduceOp op) {
  double acc = load_as_double(in[0].data(), in[0].dtype(), at);
  for (size_t r = 1; r < in.size(); ++r) {
    const double x = load_as_double(in[r].data(), in[r].dtype(), at);
    acc = op == ReduceOp::Sum ? acc + x : std::max(acc, x);
  }
  return acc;
}

// |got - ref| within tol relative to the magnitude of the summands; the reference is rounded to the dtype first.
void expect_close(const Tensor& got, int64_t i, double ref, double magnitude, double tol, const std::string& what) {
  Tensor rounded = Tensor::empty({1}, got.dtype());
  store_from_double(rounded.data(), got.dtype(), 0, ref);
  const double want = load_as_double(rounded.data(), got.dtype(), 0);
  const double g = load_as_double(got.data(), got.dtype(), i);
  ASSERT_FALSE(std::isnan(g)) << what << " element " << i << " is NaN";
  ASSERT_LE(std::fabs(g - want), tol * std::max(magnitude, 1.0)) << what << " element " << i << ": got " << g
                                                                  << ", want " << want;
}

class Collectives : public ::testing::TestWithParam<int> {};

TEST_P(Collectives, AllReduceEveryDtypeAndOp) {
  const int world = GetParam();
  std::mt19937_64 rng(testing::fresh_seed());
  const int64_t n = 37;
  for (DType dtype : {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I32, DType::I64}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
      std::vector<Tensor> in = random_buffers(world, n, dtype, rng);
      std::vector<Tensor> buf = poisoned_buffers(world, n, dtype);
      for (int r = 0; r < world; ++r) copy(buf[r], in[r]);
      comm::run_ranks(world, 10s, [&](Communicator& c) {
        c.all_reduce(buf[c.rank()].data(), n, dtype, op);
      });
      const std::string what = cat("all_reduce ", dtype_name(dtype), op == ReduceOp::Sum ? " sum" : " max");
      for (int r = 0; r < world; ++r)
        for (int64_t i = 0; i < n; ++i) {
          double magnitude = 0;
          for (int q = 0; q < world; ++q) magnitude += std::fabs(load_as_double(in[q].data(), dtype, i));
          expect_close(buf[r], i, reduce_ref(in, i, op), magnitude, tolerance(dtype, op, world), what);
        }
    }
  }
}

TEST_P(Collectives, ReduceScatterSumAndMax) {
  const int world = GetParam();
  std::mt19937_64 rng(testing::fresh_seed());
  const int64_t n = 19;  // elements per block
  for (DType dtype : {DType::F32, DType::I64, DType::BF16}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
      std::vector<Tensor> in = random_buffers(world, n * world, dtype, rng);
      std::vector<Tensor> out = poisoned_buffers(world, n, dtype);
      comm::run_ranks(world, 10s, [&](Communicator& c) {
        c.reduce_scatter(in[c.rank()].data(), out[c.rank()].data(), n, dtype, op);
      });
      for (int r = 0; r < world; ++r)
        for (int64_t i = 0; i < n; ++i) {
          double magnitude = 0;
          for (int q = 0; q < world; ++q) magnitude += std::fabs(load_as_double(in[q].data(), dtype, r * n + i));
          expect_close(out[r], i, reduce_ref(in, r * n + i, op), magnitude, tolerance(dtype, op, world),
                       cat("reduce_scatter ", dtype_name(dtype)));
        }
    }
  }
}

TEST_P(Collectives, AllGatherAllToAllBroadcastBarrier) {
  const int world = GetParam();
  std::mt19937_64 rng(testing::fresh_seed());
  const int64_t n = 23;
  std::vector<Tensor> in = random_buffers(world, n * world, DType::F32, rng);
  std::vector<Tensor> gathered = poisoned_buffers(world, n * world, DType::F32);
  std::vector<Tensor> swapped = poisoned_buffers(world, n * world, DType::F32);
  std::vector<Tensor> bcast = random_buffers(world, n, DType::I64, rng);
  const int root = world - 1;
  Tensor root_data = Tensor::empty({n}, DType::I64);
  copy(root_data, bcast[root]);
  comm::run_ranks(world, 10s, [&](Communicator& c) {
    const int r = c.rank();
    c.all_gather(in[r].ptr<float>(), gathered[r].data(), n, DType::F32);  // each rank sends its first block
    c.barrier();
    c.all_to_all(in[r].data(), swapped[r].data(), n, DType::F32);
    c.broadcast(bcast[r].data(), n, DType::I64, root);
  });
  for (int r = 0; r < world; ++r) {
    for (int q = 0; q < world; ++q) {
      for (int64_t i = 0; i < n; ++i) {
        // all_gather: block q of every rank's result is rank q's first block.
        ASSERT_EQ(gathered[r].ptr<float>()[q * n + i], in[q].ptr<float>()[i]) << "all_gather rank " << r;
        // all_to_all: block q of rank r's result is block r of rank q's send buffer.
        ASSERT_EQ(swapped[r].ptr<float>()[q * n + i], in[q].ptr<float>()[r * n + i]) << "all_to_all rank " << r;
      }
    }
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(bcast[r].ptr<int64_t>()[i], root_data.ptr<int64_t>()[i]) << "broadcast";
  }
}

TEST_P(Collectives, InPlaceAllReduceAndAllGather) {
  // NCCL allows in-place calls (recv aliasing send); the in-process communicator must give the same answer.
  const int world = GetParam();
  std::mt19937_64 rng(testing::fresh_seed());
  const int64_t n = 11;
  std::vector<Tensor> in = random_buffers(world, n, DType::I32, rng);
  std::vector<Tensor> buf = poisoned_buffers(world, n * world, DType::I32);
  for (int r = 0; r < world; ++r) copy(buf[r].view().slice(0, r * n, n), in[r]);
  comm::run_ranks(world, 10s, [&](Communicator& c) {
    const int r = c.rank();
    c.all_gather(buf[r].ptr<int32_t>() + r * n, buf[r].data(), n, DType::I32);
  });
  for (int r = 0; r < world; ++r)
    for (int q = 0; q < world; ++q)
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(buf[r].ptr<int32_t>()[q * n + i], in[q].ptr<int32_t>()[i]);
}

TEST_P(Collectives, SendRecvRingExchange) {
  const int world = GetParam();
  std::mt19937_64 rng(testing::fresh_seed());
  const int64_t n = 101;
  std::vector<Tensor> in = random_buffers(world, n, DType::BF16, rng);
  std::vector<Tensor> in2 = random_buffers(world, n, DType::BF16, rng);
  std::vector<Tensor> out = poisoned_buffers(world, n, DType::BF16);
  std::vector<Tensor> out2 = poisoned_buffers(world, n, DType::BF16);
  comm::run_ranks(world, 10s, [&](Communicator& c) {
    const int r = c.rank(), next = (r + 1) % world, prev = (r + world - 1) % world;
    // Two exchanges in flight at once, completed in reverse order: messages match by order, not by arrival.
    auto first = c.send_recv(in[r].data(), next, out[r].data(), prev, n, DType::BF16);
    auto second = c.send_recv(in2[r].data(), prev, out2[r].data(), next, n, DType::BF16);
    second->wait();
    first->wait();
  });
  for (int r = 0; r < world; ++r) {
    const int prev = (r + world - 1) % world, next = (r + 1) % world;
    EXPECT_EQ(testing::max_abs_error(out[r], in[prev]), 0.0) << "rank " << r << " from its predecessor";
    EXPECT_EQ(testing::max_abs_error(out2[r], in2[next]), 0.0) << "rank " << r << " from its successor";
  }
  // The same two buffers as the parts of one exchange (of unequal lengths), both from the predecessor.
  for (int r = 0; r < world; ++r) testing::poison(out[r]), testing::poison(out2[r]);
  comm::run_ranks(world, 10s, [&](Communicator& c) {
    const int r = c.rank(), next = (r + 1) % world, prev = (r + world - 1) % world;
    const comm::Transfer parts[2] = {{in[r].data(), out[r].data(), static_cast<size_t>(n)},
                                     {in2[r].data(), out2[r].data(), static_cast<size_t>(n - 1)}};
    c.exchange(parts, next, prev, DType::BF16)->wait();
  });
  for (int r = 0; r < world; ++r) {
    const int prev = (r + world - 1) % world;
    EXPECT_EQ(testing::max_abs_error(out[r], in[prev]), 0.0) << "rank " << r << ", part 0";
    EXPECT_EQ(testing::max_abs_error(out2[r].view().slice(0, 0, n - 1), in2[prev].view().slice(0, 0, n - 1)), 0.0)
        << "rank " << r << ", part 1";
    EXPECT_TRUE(std::isnan(load_as_double(out2[r].data(), DType::BF16, n - 1))) << "rank " << r << ": past part 1";
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, Collectives, ::testing::Values(1, 2, 3, 4, 8),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

// Runs fn on `world` ranks and returns the error run_ranks rethrew ("" if none).
std::string run_and_catch(int world, Ms timeout, const std::function<void(Communicator&)>& fn) {
  try {
    comm::run_ranks(world, timeout, fn);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// A group's size is refused outside [1, kMaxRanks] before anything (world x world mailboxes) is allocated.
TEST(InProcessFailures, AWorldOutOfRangeIsRefused) {
  for (const int world : {0, -1, comm::kMaxRanks + 1, 1 << 16}) {
    try {
      comm::make_in_process_group(world, 1000ms);
      ADD_FAILURE() << "no error for world " << world;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("world size must be in [1, 1024], got " + std::to_string(world)),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(comm::make_in_process_group(comm::kMaxRanks, 1000ms).size(), static_cast<size_t>(comm::kMaxRanks));
}

TEST(InProcessFailures, ThrowingRankFailsTheOthersFast) {
  const int world = 4;
  const Ms timeout = 5000ms;
  std::vector<double> elapsed_ms(world, -1);
  std::vector<std::string> seen(world);
  const std::string root = run_and_catch(world, timeout, [&](Communicator& c) {
    const auto start = std::chrono::steady_clock::now();
    if (c.rank() == 2) {
      std::this_thread::sleep_for(50ms);  // the others are already waiting
      throw Error("boom: layer 7 got a bad shape");
    }
    float x = 1.f, y = 0.f;
    try {
      if (c.rank() == 3) {  // a pending receive from the failing rank
        c.send_recv(&x, 0, &y, 2, 1, DType::F32)->wait();
      } else {
        c.all_reduce(&x, 1, DType::F32, ReduceOp::Sum);
      }
    } catch (const CommError& e) {
      elapsed_ms[c.rank()] =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      seen[c.rank()] = e.what();
      throw;
    }
  });
  EXPECT_NE(root.find("rank 2"), std::string::npos) << root;
  EXPECT_NE(root.find("boom: layer 7"), std::string::npos) << "run_ranks must rethrow the root cause: " << root;
  for (int r : {0, 1, 3}) {
    EXPECT_NE(seen[r].find("rank 2 failed: boom: layer 7"), std::string::npos) << "rank " << r << ": " << seen[r];
    // Fail fast: well inside the timeout, not at it (the failing rank throws after 50 ms).
    EXPECT_GE(elapsed_ms[r], 0) << "rank " << r << " did not see a CommError";
    EXPECT_LT(elapsed_ms[r], 1000) << "rank " << r << " waited " << elapsed_ms[r] << " ms";
  }
}

// A rank out of host memory: the root cause says so in words, not as a bare "std::bad_alloc".
TEST(InProcessFailures, ARankOutOfMemoryIsNamedAsSuch) {
  const std::string root = run_and_catch(2, 5000ms, [&](Communicator& c) {
    if (c.rank() == 1) throw std::bad_alloc();
    c.barrier();
  });
  EXPECT_NE(root.find("rank 1: out of host memory (std::bad_alloc)"), std::string::npos) << root;
}

// all_or_none: ranks 1 and 3 fail with different errors; every rank raises rank 1's (the lowest) as an AgreedError,
// no rank is aborted, so the group still sums after it; run_ranks reports rank 0's error, which names rank 1's cause.
TEST(InProcessFailures, AnErrorOnSomeRanksIsRaisedByAllTogether) {
  const int world = 4;
  std::vector<std::string> seen(world);
  std::vector<float> sums(world, -1.f);
  const std::string root = run_and_catch(world, 5000ms, [&](Communicator& c) {
    try {
      comm::all_or_none(c, "the step", [&] {
        if (c.rank() == 1 || c.rank() == 3) throw Error(cat("bad row on rank ", c.rank()));
      });
    } catch (const comm::AgreedError& e) {
      seen[c.rank()] = e.what();
      float x = 1.f;
      c.all_reduce(&x, 1, DType::F32, ReduceOp::Sum);
      sums[c.rank()] = x;
      throw;
    }
  });
  EXPECT_EQ(seen[1], "bad row on rank 1");
  for (int r : {0, 2, 3}) EXPECT_EQ(seen[r], "the step failed on rank 1: bad row on rank 1") << "rank " << r;
  for (int r = 0; r < world; ++r) EXPECT_EQ(sums[r], float(world)) << "rank " << r;
  EXPECT_EQ(root, "rank 0: the step failed on rank 1: bad row on rank 1");
  // Nobody fails: f ran everywhere, nothing is raised.
  std::vector<int> ran(world, 0);
  comm::run_ranks(world, 5000ms, [&](Communicator& c) { comm::all_or_none(c, "the step", [&] { ran[c.rank()] = 1; }); });
  EXPECT_EQ(ran, std::vector<int>(world, 1));
}

TEST(InProcessFailures, AbortFailsLaterOperations) {
  const std::string root = run_and_catch(3, 5000ms, [&](Communicator& c) {
    if (c.rank() == 1) {
      c.abort("giving up: out of memory");
      return;
    }
    c.barrier();
  });
  EXPECT_NE(root.find("rank 1 failed: giving up: out of memory"), std::string::npos) << root;
}

TEST(InProcessFailures, RankThatNeverJoinsTimesOut) {
  const Ms timeout = 300ms;
  std::atomic<bool> stop{false};
  std::vector<double> elapsed_ms(3, -1);
  const auto start = std::chrono::steady_clock::now();
  const std::string root = run_and_catch(3, timeout, [&](Communicator& c) {
    if (c.rank() == 2) {  // busy elsewhere until the others have given up
      while (!stop) std::this_thread::sleep_for(5ms);
      return;
    }
    try {
      double x = 1;
      c.all_reduce(&x, 1, DType::F64, ReduceOp::Max);
    } catch (const CommError&) {
      elapsed_ms[c.rank()] =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      if (elapsed_ms[0] >= 0 && elapsed_ms[1] >= 0) stop = true;
      throw;
    }
  });
  stop = true;
  EXPECT_NE(root.find("timed out after 300 ms waiting for rank(s) 2 to join"), std::string::npos) << root;
  EXPECT_NE(root.find("all_reduce #1"), std::string::npos) << root;
  for (int r : {0, 1}) {
    EXPECT_GE(elapsed_ms[r], 250) << "rank " << r << " gave up before the timeout";
    EXPECT_LT(elapsed_ms[r], 300 + 700) << "rank " << r << " took " << elapsed_ms[r] << " ms (timeout 300 ms)";
  }
}

// In a sub-group the timeout names the world ranks too: with dp x cp = 2 x 2 the second cp group's ranks 0 and 1 are
// world ranks 2 and 3, and the user's launcher and logs number them so.
TEST(InProcessFailures, ASubGroupsTimeoutNamesTheWorldRanks) {
  std::atomic<bool> stop{false};
  const std::string root = run_and_catch(4, 300ms, [&](Communicator& c) {
    const std::unique_ptr<Communicator> cp = c.split(c.rank() / 2, c.rank() % 2);
    if (c.rank() == 3) {  // busy elsewhere until world rank 2 has given up
      while (!stop) std::this_thread::sleep_for(5ms);
      return;
    }
    if (c.rank() != 2) return;
    try {
      double x = 1;
      cp->all_reduce(&x, 1, DType::F64, ReduceOp::Max);
    } catch (const CommError&) {
      stop = true;
      throw;
    }
  });
  stop = true;
  EXPECT_NE(root.find("all_reduce #1 on rank 0 (world rank 2) timed out after 300 ms waiting for rank(s) 1 (world 3) "
                      "to join"),
            std::string::npos)
      << root;
}

// Every rank is a thread of this process, so a stop (SIGSTOP, Ctrl-Z) halts the rank a wait waits for as much as the
// wait: the SIGCONT that continues the process starts the wait's timeout again. Here no stop happens, only the
// continue: rank 1 joins 1.2 s in, after the 1 s timeout, but 0.8 s after a SIGCONT at 0.4 s (margins of 0.2 s and
// more either way for a loaded machine).
TEST(InProcessFailures, AContinueAfterAStopStartsTheTimeoutAgain) {
  const auto start = std::chrono::steady_clock::now();
  const std::string root = run_and_catch(2, 1000ms, [&](Communicator& c) {
    if (c.rank() == 1) {
      std::this_thread::sleep_until(start + 400ms);
      ::kill(::getpid(), SIGCONT);
      std::this_thread::sleep_until(start + 1200ms);
    }
    double x = c.rank();
    c.all_reduce(&x, 1, DType::F64, ReduceOp::Max);
    EXPECT_EQ(x, 1.0);
  });
  EXPECT_EQ(root, "") << "the wait timed out despite the continue";
  // Without one, the same lateness is a timeout.
  const std::string late = run_and_catch(2, 1000ms, [&](Communicator& c) {
    if (c.rank() == 1) std::this_thread::sleep_for(1200ms);
    double x = c.rank();
    c.all_reduce(&x, 1, DType::F64, ReduceOp::Max);
  });
  EXPECT_NE(late.find("timed out after 1000 ms waiting for rank(s) 1 to join"), std::string::npos) << late;
}

TEST(InProcessFailures, MismatchedCollectiveRejected) {
  const std::string root = run_and_catch(2, 5000ms, [&](Communicator& c) {
    std::vector<float> buf(12, 1.f);
    c.all_reduce(buf.data(), c.rank() == 0 ? 10 : 12, DType::F32, ReduceOp::Sum);
  });
  EXPECT_NE(root.find("calls do not match"), std::string::npos) << root;
  EXPECT_NE(root.find("rank 0 all_reduce(count=10, dtype=fp32, op=sum)"), std::string::npos) << root;
  EXPECT_NE(root.find("rank 1 all_reduce(count=12, dtype=fp32, op=sum)"), std::string::npos) << root;

  const std::string other_op = run_and_catch(2, 5000ms, [&](Communicator& c) {
    int32_t v[2] = {0, 0};
    if (c.rank() == 0) c.broadcast(v, 2, DType::I32, 0);
    else c.all_gather(v, v, 1, DType::I32);
  });
  EXPECT_NE(other_op.find("broadcast(count=2, dtype=int32, root=0)"), std::string::npos) << other_op;
  EXPECT_NE(other_op.find("all_gather(count=1, dtype=int32)"), std::string::npos) << other_op;
}

TEST(InProcessFailures, MismatchedSendRecvRejected) {
  const std::string root = run_and_catch(2, 5000ms, [&](Communicator& c) {
    std::vector<float> send(6, 1.f), recv(6);
    const size_t n = c.rank() == 0 ? 5 : 6;
    c.send_recv(send.data(), 1 - c.rank(), recv.data(), 1 - c.rank(), n, DType::F32)->wait();
  });
  EXPECT_TRUE(root.find("rank 0 sent 5 fp32 elements, this rank expected 6 fp32") != std::string::npos ||
              root.find("rank 1 sent 6 fp32 elements, this rank expected 5 fp32") != std::string::npos)
      << root;
}

}  // namespace
}  // namespace ringtrain
