// The model under context parallelism on in-process CPU ranks, each with its own Policy over the group: logprobs
// (gathered back to token order) and the weight gradients (summed over the cp ranks) equal those of one rank, for
// cp = 2 and 4, ring, all-gather and all-to-all, lengths that need padding and not, and sliding windows shorter
// than the sequence (Mistral on every layer; Qwen2 on some) with all-gather and all-to-all. fp32 throughout: the CP
// merge and the per-rank reductions reorder fp32 sums, giving ~1e-6 differences; the bounds (2e-5 absolute on
// logprobs ~ -3.5, 1e-4 relative L2 on gradients) leave margin yet catch any misplaced token or lost gradient.
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <random>

#include "model_test_util.h"
#include "ringtrain/attention/selection.h"
#include "ringtrain/comm/in_process.h"
#include "ringtrain/model/policy.h"
#include "test_util.h"

namespace ringtrain {
namespace {

using model::Arch;

struct CpCase {
  int cp;
  cp::CpComm comm;
  int64_t seq;
  Arch arch;
  int64_t window = 0;                // the model's sliding_window, 0: none
  std::vector<bool> full_layers;     // full_attention_layers (3 layers when given)
};

std::string case_name(const CpCase& k) {
  return cat("cp", k.cp, "_", cp::cp_comm_name(k.comm), "_S", k.seq, "_", model::arch_model_type(k.arch),
             k.window > 0 ? cat("_w", k.window, k.full_layers.empty() ? "" : "_mixed") : std::string());
}
void PrintTo(const CpCase& k, std::ostream* os) { *os << case_name(k); }

class CpModel : public ::testing::TestWithParam<CpCase> {};

TEST_P(CpModel, MatchesOneRank) {
  const CpCase k = GetParam();
  std::mt19937_64 rng(testing::fresh_seed());
  model::ModelConfig c =
      testing::tiny_config(k.arch, k.arch == Arch::Qwen3, k.full_layers.empty() ? 2 : int64_t(k.full_layers.size()));
  c.sliding_window = k.window;
  c.full_attention_layers = k.full_layers;
  const std::vector<float> params = testing::tiny_params(c, rng);
  const std::vector<int32_t> ids = testing::random_ids(k.seq, c.vocab, rng);
  std::vector<float> d(ids.size());
  std::normal_distribution<float> nd;
  for (float& x : d) x = nd(rng);

  model::PolicyOptions o;
  o.logprob_chunk = 7;
  const auto one = model::make_policy(c, params, o);
  const model::TokenBatch batch{{ids}};
  const std::vector<float> ref = one->score(batch, true).logprobs[0];
  one->backward({d});
  const std::vector<float> one_grads = one->grads_by_layout();

  std::vector<std::vector<float>> lp(k.cp), grads(k.cp);
  comm::run_ranks(k.cp, std::chrono::seconds(60), [&](comm::Communicator& comm) {
    model::PolicyOptions ro = o;
    ro.cp_group = &comm;
    ro.cp.comm = k.comm;
    const auto p = model::make_policy(c, params, ro);
    lp[comm.rank()] = p->score(batch, true).logprobs[0];
    p->backward({d});
    grads[comm.rank()] = p->grads_by_layout();
  });
  if (k.window > 0) {  // the window must change the result, else these cases would not test it
    model::ModelConfig unwindowed = c;
    unwindowed.sliding_window = 0, unwindowed.full_attention_layers.clear();
    const std::vector<float> full = model::make_policy(unwindowed, params, o)->score(batch, false).logprobs[0];
    float most = 0;
    for (size_t p = 0; p < full.size(); ++p) most = std::max(most, std::fabs(full[p] - ref[p]));
    EXPECT_GT(most, 1e-3f) << "the window changed nothing";
  }
  for (int r = 0; r < k.cp; ++r) {
    ASSERT_EQ(lp[r].size(), ref.size());
    EXPECT_EQ(lp[r][0], 0.f);
    for (size_t p = 0; p < ref.size(); ++p)
      ASSERT_NEAR(lp[r][p], ref[p], 2e-5) << "rank " << r << " position " << p;  // NaN fails
  }
  std::vector<float> sum(grads[0].size(), 0.f);
  for (const auto& g : grads)
    for (size_t i = 0; i < g.size(); ++i) sum[i] += g[i];
  for (const model::ParamSpec& s : one->layout().specs()) {
    const TensorView got = contiguous_view(sum.data() + s.offset, DType::F32, Device::cpu(), {s.numel});
    const TensorView want =
        contiguous_view(const_cast<float*>(one_grads.data()) + s.offset, DType::F32, Device::cpu(), {s.numel});
    EXPECT_LE(testing::rel_error(got, want), 1e-4) << s.name;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Parity, CpModel,
    ::testing::Values(CpCase{2, cp::CpComm::Ring, 16, Arch::Llama}, CpCase{2, cp::CpComm::AllGather, 13, Arch::Qwen2},
                      CpCase{4, cp::CpComm::Ring, 21, Arch::Qwen3}, CpCase{4, cp::CpComm::AllGather, 24, Arch::Mistral},
                      CpCase{4, cp::CpComm::Ring, 5, Arch::Llama}, CpCase{2, cp::CpComm::AllToAll, 15, Arch::Llama},
                      CpCase{2, cp::CpComm::AllGather, 19, Arch::Mistral, 4},
                      CpCase{4, cp::CpComm::AllGather, 21, Arch::Mistral, 7},
                      CpCase{2, cp::CpComm::AllToAll, 17, Arch::Mistral, 3},
                      CpCase{3, cp::CpComm::AllGather, 20, Arch::Qwen2, 5, {false, true, false}}),
    [](const auto& info) { return case_name(info.param); });

TEST(CpModelScopes, ModelAllowListNarrowsInsideCp) {
  // Under CP the model's allow-list still applies: a model that lists only math runs only math blocks.
  std::mt19937_64 rng(testing::fresh_seed());
  const model::ModelConfig c = testing::tiny_config(Arch::Llama);
  const std::vector<float> params = testing::tiny_params(c, rng);
  const std::vector<int32_t> ids = testing::random_ids(12, c.vocab, rng);
  model::PolicyOptions o;
  o.model.attention_backends = {attention::BackendId::Math};
  attention::reset_dispatch_counts();
  comm::run_ranks(2, std::chrono::seconds(60), [&](comm::Communicator& comm) {
    model::PolicyOptions ro = o;
    ro.cp_group = &comm;
    model::make_policy(c, params, ro)->score(model::TokenBatch{{ids}}, false);
  });
  const attention::DispatchCounts n = attention::dispatch_counts();
  EXPECT_GT(n.forward[static_cast<int>(attention::BackendId::Math)], 0) << attention::format_dispatch_counts(n);
  EXPECT_EQ(n.total(), n.forward[static_cast<int>(attention::BackendId::Math)]) << attention::format_dispatch_counts(n);
}

}  // namespace
}  // namespace ringtrain
