// Backend selection: ordered allow-lists, scopes that only narrow, the context-parallel narrowing (the original
// system's crash: an inner "all backends" scope re-enabled cuDNN under CP), reports with a reason per backend,
// caching and the dispatch counters.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "attention_test_util.h"
#include "ringtrain/attention/selection.h"
#include "ringtrain/core/error.h"

namespace ringtrain {
namespace {

using namespace attention;

AttnParams cpu_params() {
  AttnParams p;
  p.heads_q = 8;
  p.heads_kv = 2;
  p.head_dim = 64;
  p.seqlen_q = p.seqlen_kv = 128;
  p.mask = MaskType::CausalTopLeft;
  return p;
}

class Selection : public ::testing::Test {
 protected:
  void SetUp() override { set_root_backends(default_backends(), "test default"); }
  void TearDown() override { set_root_backends(default_backends(), "test default"); }
};

const CandidateReport& candidate(const attention::Selection& s, BackendId id) {
  for (const auto& c : s.candidates)
    if (c.id == id) return c;
  throw Error("candidate missing");
}

TEST_F(Selection, FirstSupportedInRootOrderWins) {
  EXPECT_EQ(select(cpu_params()).id(), BackendId::Flash);  // cudnn has no CPU implementation
  set_root_backends({BackendId::Math, BackendId::Flash}, "test");
  EXPECT_EQ(select(cpu_params()).id(), BackendId::Math);
  const auto s = explain(cpu_params());
  EXPECT_TRUE(candidate(s, BackendId::Math).selected);
  EXPECT_TRUE(candidate(s, BackendId::Flash).available);
  EXPECT_NE(candidate(s, BackendId::Cudnn).reasons.at(0).find("not in the allow-list (test)"), std::string::npos);
}

TEST_F(Selection, ScopesOnlyNarrow) {
  BackendScope outer("outer", {BackendId::Math});
  EXPECT_EQ(select(cpu_params()).id(), BackendId::Math);
  {
    // An inner scope listing more backends cannot re-enable flash.
    BackendScope inner("model", {BackendId::Cudnn, BackendId::Flash, BackendId::Efficient, BackendId::Math});
    EXPECT_EQ(select(cpu_params()).id(), BackendId::Math);
    const auto s = explain(cpu_params());
    EXPECT_NE(candidate(s, BackendId::Flash).reasons.at(0).find("excluded by scope 'outer'"), std::string::npos);
  }
  {
    BackendScope inner("narrower", {BackendId::Flash});
    try {
      select(cpu_params());
      FAIL() << "nothing should fit";
    } catch (const Error& e) {
      const std::string msg = e.what();
      // Every backend is named with its reason.
      EXPECT_NE(msg.find("cudnn      rejected: excluded by scope 'outer'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("flash      rejected: excluded by scope 'outer'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("efficient  rejected: excluded by scope 'outer'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("math       rejected: excluded by scope 'narrower'"), std::string::npos) << msg;
    }
  }
  EXPECT_EQ(select(cpu_params()).id(), BackendId::Math);  // scopes popped
}

TEST_F(Selection, ScopesArePerThread) {
  BackendScope only_math("only-math", {BackendId::Math});
  BackendId other{};
  std::thread t([&] { other = select(cpu_params()).id(); });
  t.join();
  EXPECT_EQ(other, BackendId::Flash);
  EXPECT_EQ(select(cpu_params()).id(), BackendId::Math);
}

// The original bug: cp > 1 restricted the backends, then the model wrapped its forward in "all backends" and
// cuDNN ran under CP. Here the model's scope lists all four inside the CP scope; on the GPU (params on cuda) the
// non-CP-capable implementations must be rejected for that reason, whatever the inner scope says.
TEST_F(Selection, ContextParallelExcludesUnverifiedBackendsOnGpu) {
  AttnParams p = cpu_params();
  p.device = Device::cuda(0);
  p.dtype = DType::BF16;
  p.head_dim = 128;
  BackendScope cp = BackendScope::context_parallel(2);
  BackendScope model("model", {BackendId::Cudnn, BackendId::Flash, BackendId::Efficient, BackendId::Math});
  const auto s = explain(p);
  int cuda_impls = 0;
  for (BackendId id : kAllBackends) {
    const Backend* impl = find_backend(id, DeviceKind::CUDA);
    if (!impl) continue;
    ++cuda_impls;
    const auto& c = candidate(s, id);
    if (!impl->cp_capable()) {
      EXPECT_FALSE(c.selected || c.available) << backend_name(id);
      ASSERT_FALSE(c.reasons.empty());
      EXPECT_NE(c.reasons[0].find("not verified under context parallelism"), std::string::npos) << c.reasons[0];
    }
  }
  if (cuda_impls == 0) GTEST_SKIP() << "this build has no CUDA backends to exclude (CPU-only build)";
}

// The same regression end to end on CPU: under CP with a model scope of all four backends, every dispatched call
// ran a CP-capable implementation, and the counters say which.
TEST_F(Selection, DispatchUnderContextParallelOnlyRunsCpCapableBackends) {
  std::mt19937_64 rng(testing::fresh_seed());
  testing::AttnProblem pr = testing::make_problem(1, 8, 2, 64, 40, 40, MaskType::CausalTopLeft, DType::F32, rng);
  reset_dispatch_counts();
  {
    BackendScope cp = BackendScope::context_parallel(2);
    BackendScope model("model", {BackendId::Cudnn, BackendId::Flash, BackendId::Efficient, BackendId::Math});
    Tensor o = Tensor::empty({1, 40, 8, 64}, DType::F32), lse = Tensor::empty({1, 8, 40}, DType::F32);
    Tensor dq = Tensor::empty({1, 40, 8, 64}, DType::F32), dk = Tensor::empty({1, 40, 2, 64}, DType::F32),
           dv = Tensor::empty({1, 40, 2, 64}, DType::F32);
    forward(pr.p, {pr.q, pr.k, pr.v, o, lse});
    backward(pr.p, {pr.q, pr.k, pr.v, o, pr.dout, lse, dq, dk, dv});
  }
  const DispatchCounts c = dispatch_counts();
  EXPECT_EQ(c.total(), 2);
  for (BackendId id : kAllBackends) {
    const int i = static_cast<int>(id);
    if (c.forward[i] + c.backward[i] == 0) continue;
    const Backend* impl = find_backend(id, DeviceKind::CPU);
    ASSERT_NE(impl, nullptr);
    EXPECT_TRUE(impl->cp_capable()) << backend_name(id) << " ran under CP";
  }
  EXPECT_EQ(c.forward[static_cast<int>(BackendId::Flash)], 1);
  EXPECT_EQ(c.backward[static_cast<int>(BackendId::Flash)], 1);
  EXPECT_EQ(format_dispatch_counts(c), "flash: fwd 1 bwd 1");
}

TEST_F(Selection, DecisionIsDeterministicAndCached) {
  const auto a = explain(cpu_params());
  const auto b = explain(cpu_params());
  EXPECT_EQ(a.backend, b.backend);
  EXPECT_EQ(a.report(), b.report());
  AttnParams other = cpu_params();
  other.dtype = DType::F64;  // flash refuses fp64: the cache must not return flash for it
  const auto c = explain(other);
  EXPECT_EQ(c.backend->id(), BackendId::Math);
  EXPECT_NE(candidate(c, BackendId::Flash).reasons.at(0).find("fp64"), std::string::npos);
}

// The default order by head dim: flash first on CUDA at head dim 64 and above 128 (the same members), cuDNN first at
// other head dims and on the CPU, whether or not a backward follows; a list set explicitly stays as given.
TEST_F(Selection, TheDefaultOrderFollowsTheHeadDim) {
  AttnParams gpu64 = cpu_params();
  gpu64.device = Device::cuda(0);
  gpu64.dtype = DType::BF16;
  AttnParams gpu128 = gpu64;
  gpu128.head_dim = 128;
  std::vector<BackendId> flash_first = default_backends(gpu64), all = default_backends();
  EXPECT_EQ(flash_first.front(), BackendId::Flash);
  EXPECT_EQ(all.front(), BackendId::Cudnn);
  std::sort(flash_first.begin(), flash_first.end()), std::sort(all.begin(), all.end());
  EXPECT_EQ(flash_first, all);
  for (const int64_t d : {32, 96, 128}) {
    AttnParams p = gpu64;
    p.head_dim = d;
    EXPECT_EQ(default_backends(p), default_backends()) << d;
  }
  for (const int64_t d : {192, 256}) {
    AttnParams p = gpu64;
    p.head_dim = d;
    EXPECT_EQ(default_backends(p), default_backends(gpu64)) << d;
  }
  AttnParams gpu256 = gpu64;
  gpu256.head_dim = 256;
  for (const int64_t d : {64, 256}) {
    AttnParams p = cpu_params();
    p.head_dim = d;
    EXPECT_EQ(default_backends(p), default_backends()) << d;
  }

  if (std::getenv("RINGTRAIN_SDPA_BACKENDS")) GTEST_SKIP() << "RINGTRAIN_SDPA_BACKENDS sets the order explicitly";
  reset_root_backends();
  for (const bool backward : {true, false}) {
    const BackendScope no_backward = BackendScope::forward_only(!backward);
    const auto s = explain(gpu64);
    EXPECT_EQ(s.candidates.front().id, BackendId::Flash) << s.report();
    EXPECT_NE(s.scopes.find("default order for head dim 64"), std::string::npos) << s.scopes;
    EXPECT_EQ(s.scopes.find("> forward only") != std::string::npos, !backward) << s.scopes;
    const auto s256 = explain(gpu256);
    EXPECT_EQ(s256.candidates.front().id, BackendId::Flash) << s256.report();
    EXPECT_NE(s256.scopes.find("default order for head dim 256"), std::string::npos) << s256.scopes;
    const auto s128 = explain(gpu128);
    EXPECT_EQ(s128.candidates.front().id, BackendId::Cudnn) << s128.report();
    EXPECT_EQ(s128.scopes.find("head dim"), std::string::npos) << s128.scopes;
    EXPECT_EQ(select(cpu_params()).id(), BackendId::Flash);
    BackendScope model("model", {BackendId::Math});  // narrows as ever
    EXPECT_EQ(select(cpu_params()).id(), BackendId::Math);
  }
  set_root_backends(default_backends(), "test");
  EXPECT_EQ(explain(gpu64).candidates.front().id, BackendId::Cudnn);  // an explicit list is used as given
}

// A KV-cache call (the sampler's decoding step) on the CPU: every CPU backend rejects it with the KV-cache reason,
// decode has no CPU implementation, so nothing serves it and the report says why for each.
TEST_F(Selection, KvCacheCallsGoOnlyToDecode) {
  AttnParams p = cpu_params();
  p.seqlen_q = 1, p.seqlen_kv = 512, p.mask = MaskType::CausalBottomRight, p.kv_cache = true;
  const auto s = explain(p);
  EXPECT_EQ(s.backend, nullptr) << s.report();
  for (BackendId id : {BackendId::Flash, BackendId::Math}) {
    const auto& reasons = candidate(s, id).reasons;
    EXPECT_NE(std::find(reasons.begin(), reasons.end(), kv_cache_reason()), reasons.end()) << s.report();
  }
  EXPECT_NE(candidate(s, BackendId::Decode).reasons.at(0).find("no cpu implementation"), std::string::npos)
      << s.report();
  EXPECT_NE(s.report().find("kv_cache"), std::string::npos) << s.report();
  p.kv_cache = false;
  EXPECT_NE(explain(p).backend, nullptr);  // the same shape without a cache is an ordinary call
}

TEST(AttentionValidation, KvCacheCallsNeedUsedLengthsAndHaveNoBackward) {
  std::mt19937_64 rng(testing::fresh_seed());
  testing::AttnProblem pr = testing::make_problem(2, 4, 2, 16, 1, 10, MaskType::CausalBottomRight, DType::F32, rng);
  Tensor o = Tensor::empty({2, 1, 4, 16}, DType::F32), lse = Tensor::empty({2, 4, 1}, DType::F32);
  AttnParams p = pr.p;
  p.kv_cache = true;
  attention::AttnForwardArgs a{pr.q, pr.k, pr.v, o, lse};
  try {
    validate(p, a);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'kv_used' int32 [2]"), std::string::npos) << e.what();
  }
  Tensor used = Tensor::empty({2}, DType::I32);
  a.kv_used = used;
  validate(p, a);
  p.kv_cache = false;
  EXPECT_THROW(validate(p, a), Error);  // used lengths on an ordinary call
  p.kv_cache = true;
  Tensor d = Tensor::empty({2, 1, 4, 16}, DType::F32), dkv = Tensor::empty({2, 10, 2, 16}, DType::F32);
  EXPECT_THROW(validate(p, attention::AttnBackwardArgs{pr.q, pr.k, pr.v, o, d, lse, d, dkv, dkv}), Error);
}

TEST(BackendList, ParsesAndRejectsClearly) {
  EXPECT_EQ(parse_backend_list("decode,math"), (std::vector<BackendId>{BackendId::Decode, BackendId::Math}));
  EXPECT_EQ(parse_backend_list("cudnn, flash,math"),
            (std::vector<BackendId>{BackendId::Cudnn, BackendId::Flash, BackendId::Math}));
  EXPECT_THROW(
      {
        try {
          parse_backend_list("flash,sdpa");
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("unknown attention backend 'sdpa'"), std::string::npos);
          throw;
        }
      },
      Error);
  EXPECT_THROW(parse_backend_list("flash,flash"), Error);
  EXPECT_THROW(parse_backend_list("flash,"), Error);
  EXPECT_THROW(set_root_backends({}, "empty"), Error);
}

TEST(AttentionValidation, BadShapesNameTheTensor) {
  std::mt19937_64 rng(testing::fresh_seed());
  testing::AttnProblem pr = testing::make_problem(1, 4, 2, 16, 10, 10, MaskType::None, DType::F32, rng);
  Tensor o = Tensor::empty({1, 10, 4, 16}, DType::F32), bad_lse = Tensor::empty({1, 4, 9}, DType::F32);
  try {
    forward(pr.p, {pr.q, pr.k, pr.v, o, bad_lse});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'lse' is [1, 4, 9]"), std::string::npos) << e.what();
  }
  AttnParams p = pr.p;
  p.heads_kv = 3;
  try {
    forward(p, {pr.q, pr.k, pr.v, o, bad_lse});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of kv heads"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ringtrain
