// The project's core invariant under context parallelism, a scope can only narrow: a model-level scope that lists
// every backend cannot re-enable a backend the CP scope excluded, every block call is counted on a CP-capable backend,
// and a scope that leaves no CP-capable backend fails with every backend's reason.
#include <gtest/gtest.h>

#include <chrono>

#include "ringtrain/attention/selection.h"
#include "ringtrain/comm/in_process.h"
#include "ringtrain/check/attention_check.h"
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
  const check::AttnProblem prob{1, 48, 4, 2, 32, true, DType::F32};  // 48 = 2 * 4 * 6: every ring block is non-empty
  const check::AttnInputs in = check::random_inputs(prob, testing::fresh_seed());
  const check::AttnResults ref = check::reference_attention(prob, in);
  for (cp::CpComm comm : {cp::CpComm::Ring, cp::CpComm::AllGather}) {
    attention::reset_dispatch_counts();
    check::CpRunOptions opt;
    opt.cp = 4;
    opt.config.comm = comm;
    opt.model_scope = kAllFour;  // a model scope that lists every backend
    const check::AttnResults got = check::cp_attention_on_ranks(prob, in, opt);
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
  // The decision itself, with the model scope inside the CP scope.
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
  const check::AttnProblem prob{1, 16, 2, 2, 32, true, DType::F32};
  const check::AttnInputs in = check::random_inputs(prob, testing::fresh_seed());
  check::CpRunOptions opt;
  opt.cp = 2;
  opt.timeout = std::chrono::milliseconds(10000);
  opt.model_scope = {BackendId::Cudnn, BackendId::Efficient};
  try {
    check::cp_attention_on_ranks(prob, in, opt);
    FAIL() << "CP attention ran although no backend may run";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no attention backend can serve this call"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ringtrain
