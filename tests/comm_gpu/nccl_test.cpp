// The NCCL communicator on two GPUs: every collective against a host computation, and a dead peer that must make
// the survivor fail within the timeout. The parent test starts this program once per rank through
// `launch_local` (the code of `ringtrain launch`); the NcclRank / NcclDeadPeer tests run only inside those ranks.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <random>

#include "ringtrain/comm/rendezvous.h"
#include "test_util.h"
#ifdef RINGTRAIN_WITH_NCCL
#include "ringtrain/comm/nccl/nccl_communicator.h"
#endif

namespace ringtrain::comm {
namespace {

using testing::inside_rank;

constexpr std::chrono::milliseconds kGrace(2000);  // how long the launcher lets a rank finish after the other failed

TEST(NcclGroup, CollectivesOnTwoGpus) {
  if (inside_rank()) GTEST_SKIP() << "parent test";
  RT_REQUIRE_GPU();
#ifndef RINGTRAIN_WITH_NCCL
  GTEST_SKIP() << "this build has no NCCL communicator";
#endif
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs 2 GPUs, found " << cuda_device_count();
  EXPECT_EQ(testing::run_ranks_of_this_program("NcclRank.*", 2, kGrace), 0);
}

TEST(NcclGroup, DeadPeerFailsTheSurvivorWithinTimeout) {
  if (inside_rank()) GTEST_SKIP() << "parent test";
  RT_REQUIRE_GPU();
#ifndef RINGTRAIN_WITH_NCCL
  GTEST_SKIP() << "this build has no NCCL communicator";
#endif
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs 2 GPUs, found " << cuda_device_count();
  EXPECT_EQ(testing::run_ranks_of_this_program("NcclDeadPeer.*", 2, kGrace), 0);
}

#ifdef RINGTRAIN_WITH_NCCL
std::vector<float> rank_data(uint64_t seed, int rank, size_t n) {
  std::mt19937_64 rng(seed * 1000003 + rank);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

Tensor to_device(const std::vector<float>& v, Device dev) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::F32, dev);
  copy(t, contiguous_view(const_cast<float*>(v.data()), DType::F32, Device::cpu(), {static_cast<int64_t>(v.size())}));
  return t;
}

std::vector<float> to_host(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  copy(contiguous_view(v.data(), DType::F32, Device::cpu(), {t.numel()}), t);
  return v;
}

TEST(NcclRank, EveryCollectiveMatchesTheHost) {
  if (!inside_rank()) GTEST_SKIP() << "runs inside a rank started by the parent test";
  const RankInfo info = rank_info_from_environment();
  auto comm = make_nccl_communicator(info, std::chrono::seconds(60));
  const int r = comm->rank(), w = comm->size();
  const Device dev = comm->device();
  // A fresh seed chosen by rank 0 and broadcast, so both ranks can compute every rank's data.
  std::vector<float> seed_host = {static_cast<float>(std::random_device{}() % 100000)};
  Tensor seed_dev = to_device(seed_host, dev);
  comm->broadcast(seed_dev.data(), 1, DType::F32, 0);
  const uint64_t seed = static_cast<uint64_t>(to_host(seed_dev)[0]);
  const size_t n = 1000;
  std::vector<std::vector<float>> all(w);
  for (int q = 0; q < w; ++q) all[q] = rank_data(seed, q, n * w);
  const std::vector<float>& mine = all[r];

  Tensor buf = to_device(mine, dev);  // all_reduce sum
  comm->all_reduce(buf.data(), n * w, DType::F32, ReduceOp::Sum);
  std::vector<float> got = to_host(buf);
  for (size_t i = 0; i < n * w; ++i) ASSERT_NEAR(got[i], all[0][i] + all[1][i], 1e-6) << i;

  buf = to_device(mine, dev);  // all_reduce max
  comm->all_reduce(buf.data(), n * w, DType::F32, ReduceOp::Max);
  got = to_host(buf);
  for (size_t i = 0; i < n * w; ++i) ASSERT_EQ(got[i], std::max(all[0][i], all[1][i])) << i;

  Tensor send = to_device(mine, dev);  // all_gather of the first n elements
  Tensor gathered = Tensor::empty({static_cast<int64_t>(n * w)}, DType::F32, dev);
  comm->all_gather(send.data(), gathered.data(), n, DType::F32);
  got = to_host(gathered);
  for (int q = 0; q < w; ++q)
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[q * n + i], all[q][i]);

  Tensor part = Tensor::empty({static_cast<int64_t>(n)}, DType::F32, dev);  // reduce_scatter
  comm->reduce_scatter(send.data(), part.data(), n, DType::F32, ReduceOp::Sum);
  got = to_host(part);
  for (size_t i = 0; i < n; ++i) ASSERT_NEAR(got[i], all[0][r * n + i] + all[1][r * n + i], 1e-6);

  Tensor a2a = Tensor::empty({static_cast<int64_t>(n * w)}, DType::F32, dev);  // all_to_all
  comm->all_to_all(send.data(), a2a.data(), n, DType::F32);
  got = to_host(a2a);
  for (int q = 0; q < w; ++q)
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[q * n + i], all[q][r * n + i]);

  Tensor recv = Tensor::empty({static_cast<int64_t>(n)}, DType::F32, dev);  // ring step
  comm->send_recv(send.data(), (r + 1) % w, recv.data(), (r + w - 1) % w, n, DType::F32)->wait();
  got = to_host(recv);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], all[(r + w - 1) % w][i]);

  Tensor recv2 = Tensor::empty({static_cast<int64_t>(n)}, DType::F32, dev);  // a ring step of two parts
  const comm::Transfer parts[2] = {{send.data(), recv.data(), n / 2},
                                   {static_cast<const float*>(send.data()) + n / 2, recv2.data(), n - n / 2}};
  comm->exchange(parts, (r + w - 1) % w, (r + 1) % w, DType::F32)->wait();
  got = to_host(recv);
  const std::vector<float> got2 = to_host(recv2);
  for (size_t i = 0; i < n / 2; ++i) ASSERT_EQ(got[i], all[(r + 1) % w][i]);
  for (size_t i = n / 2; i < n; ++i) ASSERT_EQ(got2[i - n / 2], all[(r + 1) % w][i]);

  // Sub-groups (ncclCommSplit): every rank alone, and all ranks in reversed order.
  auto alone = comm->split(r, 0);
  ASSERT_EQ(alone->size(), 1);
  ASSERT_EQ(alone->rank(), 0);
  buf = to_device(mine, dev);
  alone->all_reduce(buf.data(), n, DType::F32, ReduceOp::Sum);
  got = to_host(buf);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], mine[i]);
  auto reversed = comm->split(0, -r);
  ASSERT_EQ(reversed->size(), w);
  ASSERT_EQ(reversed->rank(), w - 1 - r);
  reversed->all_gather(send.data(), gathered.data(), n, DType::F32);
  got = to_host(gathered);
  for (int q = 0; q < w; ++q)
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[q * n + i], all[w - 1 - q][i]) << "block " << q;
  reversed->barrier();
  comm->barrier();
}

TEST(NcclDeadPeer, SurvivorFailsWithinTimeout) {
  if (!inside_rank()) GTEST_SKIP() << "runs inside a rank started by the parent test";
  const RankInfo info = rank_info_from_environment();
  auto comm = make_nccl_communicator(info, std::chrono::seconds(5));
  comm->barrier();
  if (comm->rank() == 1) std::_Exit(0);  // dies without a word, like a crashed process
  Tensor buf = Tensor::zeros({1024}, DType::F32, comm->device());
  const auto t0 = std::chrono::steady_clock::now();
  try {
    comm->all_reduce(buf.data(), 1024, DType::F32, ReduceOp::Sum);
    FAIL() << "all_reduce with a dead peer returned";
  } catch (const CommError& e) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("survivor failed after %.2f s: %s\n", s, e.what());
    EXPECT_LT(s, 15.0);
  }
}
#endif

}  // namespace
}  // namespace ringtrain::comm
