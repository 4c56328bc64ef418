// Context parallelism on two GPUs through NCCL: for every GPU backend, ring, all-gather and all-to-all, causal and
// not, GQA, lengths that need padding and one long sequence, CP attention equals the single-GPU result of the same
// backend on the same inputs (O, LSE, dQ, dK, dV within the bf16 bar). Also the original bug on the GPU: with a model scope
// listing all four backends inside CP, only CP-capable implementations run.
// The parent tests start this program on two ranks (launch_local); the CpRank tests run inside those ranks.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <random>

#include "ringtrain/attention/selection.h"
#include "ringtrain/comm/launch.h"
#include "ringtrain/comm/rendezvous.h"
#include "test_util.h"
#ifdef RINGTRAIN_WITH_NCCL
#include "ringtrain/comm/nccl/nccl_communicator.h"
#include "ringtrain/cp/device_run.h"
#endif

namespace ringtrain::cp {
namespace {

using attention::BackendId;

bool inside_rank() { return std::getenv("RANK") != nullptr; }

TEST(CpTwoGpus, ParityForEveryBackend) {
  if (inside_rank()) GTEST_SKIP() << "parent test";
  RT_REQUIRE_GPU();
#ifndef RINGTRAIN_WITH_NCCL
  GTEST_SKIP() << "this build has no NCCL communicator";
#endif
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs 2 GPUs, found " << cuda_device_count();
  comm::LaunchOptions o;
  o.nproc = 2;
  o.master_port = 33000 + static_cast<int>(std::random_device{}() % 20000);
  EXPECT_EQ(comm::launch_local(o, {"/proc/self/exe", "--gtest_filter=CpRank.*"}), 0);
}

#ifdef RINGTRAIN_WITH_NCCL
struct Case {
  BackendId backend;
  CpComm comm;
  bool causal;
  int64_t seq, heads_q, heads_kv;
};

// bf16: both sides round fp32 results of the same products to 8 mantissa bits, in another order; 1e-2 relative
// is the project's bf16 bar (typical values 2e-3 to 5e-3).
constexpr double kBf16Tol = 1e-2;

TEST(CpRank, EveryGpuBackendMatchesOneGpu) {
  if (!inside_rank()) GTEST_SKIP() << "runs inside a rank started by the parent test";
  auto comm = comm::make_nccl_communicator(comm::rank_info_from_environment(), std::chrono::seconds(120));
  std::vector<Case> cases;
  for (BackendId b : attention::kAllBackends) {
    const attention::Backend* impl = attention::find_backend(b, DeviceKind::CUDA);
    if (!impl || !impl->cp_capable()) continue;
    for (CpComm c : {CpComm::Ring, CpComm::AllGather, CpComm::AllToAll}) {
      // 4099 needs padding. All-gather attends each query chunk with a bottom-right causal mask of Sq=c against
      // Skv=(j+1)c keys, which cuDNN serves only for multiples of 64: cudnn gets 4096 there (its stated limit).
      const int64_t seq = (b == BackendId::Cudnn && c == CpComm::AllGather) ? 4096 : 4099;
      for (bool causal : {true, false}) cases.push_back({b, c, causal, seq, 8, 2});
    }
  }
  ASSERT_FALSE(cases.empty()) << "no GPU backend is declared CP-capable";
  for (BackendId b : {BackendId::Flash, BackendId::Cudnn}) {
    const attention::Backend* impl = attention::find_backend(b, DeviceKind::CUDA);
    if (impl && impl->cp_capable()) cases.push_back({b, CpComm::Ring, true, 131072, 8, 8});
  }
  const uint64_t seed = std::strtoull(std::getenv("MASTER_PORT"), nullptr, 10);  // fresh per run, same on both ranks
  for (const Case& c : cases) {
    attention::set_root_backends({c.backend}, "test");
    DeviceRunOptions opt;
    opt.prob = {1, c.seq, c.heads_q, c.heads_kv, 128, c.causal, DType::BF16};
    opt.config.comm = c.comm;
    opt.seed = seed + c.seq;
    const DeviceRunResult r = run_cp_on_device(*comm, opt);
    const std::string what = cat(attention::backend_name(c.backend), " ", cp_comm_name(c.comm), c.causal ? " causal" : "",
                                 " S=", c.seq);
    if (comm->rank() == 0)
      std::printf("%s: O %.2e LSE %.2e dQ %.2e dK %.2e dV %.2e\n", what.c_str(), r.err_o, r.err_lse, r.err_dq, r.err_dk,
                  r.err_dv);
    EXPECT_LE(r.err_o, kBf16Tol) << what;
    EXPECT_LE(r.err_lse, kBf16Tol) << what;
    EXPECT_LE(r.err_dq, kBf16Tol) << what;
    EXPECT_LE(r.err_dk, kBf16Tol) << what;
    EXPECT_LE(r.err_dv, kBf16Tol) << what;
    const int i = static_cast<int>(c.backend);
    EXPECT_GT(r.dispatches.forward[i], 0) << what;
    EXPECT_EQ(r.dispatches.total(), r.dispatches.forward[i] + r.dispatches.backward[i]) << what;
  }
}

// The original crash's situation on the GPU: every backend allowed at the root and by the model, cp = 2. Whatever
// runs must be declared CP-capable.
TEST(CpRank, ModelScopeCannotWidenCpOnGpu) {
  if (!inside_rank()) GTEST_SKIP() << "runs inside a rank started by the parent test";
  auto comm = comm::make_nccl_communicator(comm::rank_info_from_environment(), std::chrono::seconds(120));
  attention::set_root_backends(attention::default_backends(), "test");
  const attention::BackendScope model("model", {BackendId::Cudnn, BackendId::Flash, BackendId::Efficient,
                                                BackendId::Math});
  DeviceRunOptions opt;
  opt.prob = {1, 2048, 8, 2, 128, true, DType::BF16};
  const DeviceRunResult r = run_cp_on_device(*comm, opt);
  for (BackendId b : attention::kAllBackends) {
    const int i = static_cast<int>(b);
    if (r.dispatches.forward[i] + r.dispatches.backward[i] == 0) continue;
    const attention::Backend* impl = attention::find_backend(b, DeviceKind::CUDA);
    ASSERT_NE(impl, nullptr);
    EXPECT_TRUE(impl->cp_capable()) << attention::backend_name(b) << " ran under CP";
  }
  EXPECT_GT(r.dispatches.total(), 0);
}
#endif

}  // namespace
}  // namespace ringtrain::cp
