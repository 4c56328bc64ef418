// The project's core invariant under context parallelism (the original bug): a model-level scope that lists every
// backend cannot re-enable a backend the CP scope excluded, every block call is counted on a CP-capable backend,
// and a scope that leaves no CP-capable backend fails with every backend's reason. Also: a rank that fails in the
// middle of the ring makes the others fail fast instead of hanging.
#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "ringtrain/attention/selection.h"
#include "ringtrain/comm/in_process.h"
#include "ringtrain/cp/cp_check.h"
#include "ringtrain/cp/zigzag.h"
#include "root_list_guard.h"
#include "test_util.h"

namespace ringtrain {
namespace {

using attention::BackendId;
using attention::BackendScope;

const std::vector<BackendId> kAllFour = {BackendId::Cudnn, BackendId::Flash, BackendId::Efficient, BackendId::Math};

TEST(CpSelection, ModelScopeListingAllBackendsRunsOnlyCpCapableOnes) {
  testing::RootListGuard guard;
  attention::set_root_backends(kAllFour, "test: model config");
  const cp::AttnProblem prob{1, 48, 4, 2, 32, true, DType::F32};  // 48 = 2 * 4 * 6: every ring block is non-empty
  const cp::AttnInputs in = cp::random_inputs(prob, testing::fresh_seed());
  const cp::AttnResults ref = cp::reference_attention(prob, in);
  for (cp::CpComm comm : {cp::CpComm::Ring, cp::CpComm::AllGather}) {
    attention::reset_dispatch_counts();
    cp::CpRunOptions opt;
    opt.cp = 4;
    opt.config.comm = comm;
    opt.model_scope = kAllFour;  // what the model of the original bug did
    const cp::AttnResults got = cp::cp_attention_on_ranks(prob, in, opt);
    const attention::DispatchCounts n = attention::dispatch_counts();
    SCOPED_TRACE(cat(cp::cp_comm_name(comm), ": ", attention::format_dispatch_counts(n)));
    // Ring: cp blocks per rank; all-gather: one block per local query chunk (2 per rank).
    const int64_t blocks = comm == cp::CpComm::Ring ? 4 * 4 : 4 * 2;
    EXPECT_EQ(n.forward[static_cast<int>(BackendId::Flash)], blocks);
    EXPECT_EQ(n.backward[static_cast<int>(BackendId::Flash)], blocks);
    EXPECT_EQ(n.total(), 2 * blocks) << "a call ran on a backend other than flash";
    EXPECT_LE(testing::rel_error(got.o, ref.o), 1e-5);  // fp32 tolerance: see cp_attention_test.cpp
    EXPECT_LE(testing::rel_error(got.dk, ref.dk), 1e-5);
  }
  // The decision itself, with the scopes in the order of the bug (model scope inside the CP scope).
  const BackendScope cp_scope = BackendScope::context_parallel(4);
  const BackendScope model("model", kAllFour);
  attention::AttnParams p;
  p.heads_q = 4;
  p.heads_kv = 2;
  p.head_dim = 32;
  p.seqlen_q = p.seqlen_kv = 12;
  p.mask = attention::MaskType::CausalTopLeft;
  const attention::Selection s = attention::explain(p);
  ASSERT_NE(s.backend, nullptr) << s.report();
  EXPECT_EQ(s.backend->id(), BackendId::Flash) << s.report();
  EXPECT_TRUE(s.backend->cp_capable());
  EXPECT_NE(s.scopes.find("context-parallel cp=4"), std::string::npos) << s.scopes;
}

TEST(CpSelection, ScopeWithoutCpCapableBackendFailsWithEveryReason) {
  attention::AttnParams p;
  p.heads_q = p.heads_kv = 2;
  p.head_dim = 32;
  p.seqlen_q = p.seqlen_kv = 8;
  {
    const BackendScope cp_scope = BackendScope::context_parallel(2);
    const BackendScope model("model", {BackendId::Cudnn, BackendId::Efficient});
    try {
      attention::select(p);
      FAIL() << "a backend was selected although none may run";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("no attention backend can serve this call"), std::string::npos) << msg;
      for (const char* name : {"cudnn", "flash", "efficient", "math"})
        EXPECT_NE(msg.find(cat("  ", name)), std::string::npos) << name << " missing from\n" << msg;
      EXPECT_NE(msg.find("flash      rejected: excluded by scope 'model' [cudnn,efficient]"), std::string::npos) << msg;
      EXPECT_NE(msg.find("math       rejected: excluded by scope 'model' [cudnn,efficient]"), std::string::npos) << msg;
      EXPECT_NE(msg.find("cudnn      rejected: no cpu implementation"), std::string::npos) << msg;
    }
  }
  // The same through the CP entry points: every rank fails with the report, nobody hangs.
  const cp::AttnProblem prob{1, 16, 2, 2, 32, true, DType::F32};
  const cp::AttnInputs in = cp::random_inputs(prob, testing::fresh_seed());
  cp::CpRunOptions opt;
  opt.cp = 2;
  opt.timeout = std::chrono::milliseconds(10000);
  opt.model_scope = {BackendId::Cudnn, BackendId::Efficient};
  try {
    cp::cp_attention_on_ranks(prob, in, opt);
    FAIL() << "CP attention ran although no backend may run";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no attention backend can serve this call"), std::string::npos) << e.what();
  }
}

// Forwards to a real communicator, but throws at its n-th send_recv (1-based) on the chosen rank.
class FailingComm final : public comm::Communicator {
 public:
  FailingComm(comm::Communicator& inner, int fail_at) : inner_(inner), fail_at_(fail_at) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  Device device() const override { return inner_.device(); }
  std::chrono::milliseconds timeout() const override { return inner_.timeout(); }
  std::unique_ptr<comm::Request> exchange(std::span<const comm::Transfer> parts, int dst, int src, DType dtype,
                                          void* stream) override {
    if (++sends_ == fail_at_) throw Error(cat("injected failure at ring exchange ", sends_, " on rank ", rank()));
    return inner_.exchange(parts, dst, src, dtype, stream);
  }
  void all_gather(const void* s, void* r, size_t n, DType t, void* st) override { inner_.all_gather(s, r, n, t, st); }
  void reduce_scatter(const void* s, void* r, size_t n, DType t, comm::ReduceOp op, void* st) override {
    inner_.reduce_scatter(s, r, n, t, op, st);
  }
  void all_reduce(void* b, size_t n, DType t, comm::ReduceOp op, void* st) override {
    inner_.all_reduce(b, n, t, op, st);
  }
  void all_to_all(const void* s, void* r, size_t n, DType t, void* st) override { inner_.all_to_all(s, r, n, t, st); }
  void broadcast(void* b, size_t n, DType t, int root, void* st) override { inner_.broadcast(b, n, t, root, st); }
  void barrier() override { inner_.barrier(); }
  std::unique_ptr<comm::Communicator> split(int color, int key) override { return inner_.split(color, key); }
  void abort(const std::string& why) override { inner_.abort(why); }

 private:
  comm::Communicator& inner_;
  int fail_at_;
  int sends_ = 0;
};

TEST(CpFailures, RankFailingMidRingFailsTheOthersFast) {
  const int cp_size = 4;
  const auto timeout = std::chrono::milliseconds(10000);
  const uint64_t seed = testing::fresh_seed();
  std::vector<std::string> seen(cp_size);
  const auto start = std::chrono::steady_clock::now();
  std::string root;
  try {
    comm::run_ranks(cp_size, timeout, [&](comm::Communicator& c) {
      // Rank 2 fails at its 2nd exchange of the backward ring (the forward ring makes cp-1 = 3 of them).
      FailingComm fc(c, c.rank() == 2 ? 3 + 2 : -1);
      const cp::ZigzagLayout l(cp_size, c.rank(), 40);
      const int64_t len = l.local_len();
      std::mt19937_64 rng(seed + c.rank());
      auto make = [&](int64_t heads) { return Tensor::empty({1, len, heads, 32}, DType::F32); };
      const Tensor q = make(2), k = make(1), v = make(1), dout = make(2);
      for (const Tensor* t : {&q, &k, &v, &dout}) testing::fill_normal(*t, rng);
      const Tensor o = make(2), dq = make(2), dk = make(1), dv = make(1);
      const Tensor lse = Tensor::empty({1, 2, len}, DType::F32);
      const auto params = attention::params_for(q, k, attention::MaskType::CausalTopLeft);
      attention::AttnForwardArgs fa;
      fa.q = q;
      fa.k = k;
      fa.v = v;
      fa.o = o;
      fa.lse = lse;
      attention::AttnBackwardArgs ba;
      ba.q = q;
      ba.k = k;
      ba.v = v;
      ba.o = o;
      ba.dout = dout;
      ba.lse = lse;
      ba.dq = dq;
      ba.dk = dk;
      ba.dv = dv;
      try {
        cp::attention_forward(fc, {}, params, fa, 40);
        cp::attention_backward(fc, {}, params, ba, 40);
      } catch (const std::exception& e) {
        seen[c.rank()] = e.what();
        throw;
      }
    });
  } catch (const Error& e) {
    root = e.what();
  }
  const double elapsed_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(root.find("rank 2: injected failure at ring exchange 5 on rank 2"), std::string::npos) << root;
  for (int r : {0, 1, 3}) EXPECT_NE(seen[r].find("rank 2 failed: injected failure"), std::string::npos) << seen[r];
  EXPECT_LT(elapsed_ms, 3000) << "the others should fail at once, not at the " << timeout.count() << " ms timeout";
}

}  // namespace
}  // namespace ringtrain
