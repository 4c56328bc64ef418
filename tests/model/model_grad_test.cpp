// The whole model's gradients (every weight tensor of each architecture variant) against central finite
// differences of the fp64 model, with loss = Σ_p r_p · logprob_p (random r). Attention is the CPU math backend
// with fp64 accumulation; its LSE is fp32 by the attention layer's convention, which puts ~1e-7 relative error
// into the analytic attention gradients, so the tolerance is 1e-6 absolute plus 2e-5 relative (a wrong term in
// any backward is off by O(1) relative).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "model_test_util.h"
#include "ringtrain/attention/cpu/cpu_backends.h"
#include "ringtrain/attention/selection.h"
#include "ringtrain/core/error.h"
#include "ringtrain/model/logprobs.h"
#include "test_util.h"

namespace ringtrain {
namespace {

using attention::BackendId;
using model::Arch;
using model::Model;
using model::ModelConfig;

struct Variant {
  const char* name;
  Arch arch;
  bool tied;
};

void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

class ModelGrad : public ::testing::TestWithParam<Variant> {};

double weighted_sum(const std::vector<double>& lp, const std::vector<double>& r) {
  double s = 0;
  for (size_t i = 0; i < lp.size(); ++i) s += lp[i] * r[i];
  return s;
}

TEST_P(ModelGrad, FiniteDifferencesFp64) {
  attention::cpu::set_math_fp64(true);
  std::mt19937_64 rng(testing::fresh_seed());
  const ModelConfig c = testing::tiny_config(GetParam().arch, GetParam().tied);
  model::ModelOptions opts;
  opts.attention_backends = {BackendId::Math};
  Model<double> m(c, testing::tiny_params(c, rng), opts);
  const std::vector<int32_t> ids = testing::random_ids(9, c.vocab, rng);
  std::vector<double> r(ids.size());
  std::normal_distribution<double> nd;
  for (double& x : r) x = nd(rng);
  auto attn = model::make_local_attention();
  auto loss = [&] { return weighted_sum(model::sequence_logprobs(m, ids, *attn, 4), r); };

  m.zero_grads();
  model::sequence_logprobs(m, ids, *attn, 4, /*for_backward=*/true);
  model::sequence_logprobs_backward(m, ids, r, *attn, 4);
  const std::vector<double> grads = m.grads();

  const double h = 1e-5;
  std::uniform_int_distribution<int64_t> pick;
  for (const model::ParamSpec& s : m.layout().specs()) {
    for (int k = 0; k < 4; ++k) {
      const int64_t i = s.offset + pick(rng) % s.numel;
      double& w = m.params()[i];
      const double keep = w;
      w = keep + h;
      const double up = loss();
      w = keep - h;
      const double down = loss();
      w = keep;
      const double fd = (up - down) / (2 * h);
      ASSERT_TRUE(std::isfinite(grads[i])) << s.name;
      ASSERT_NEAR(grads[i], fd, 1e-6 + 2e-5 * std::fabs(fd)) << s.name << " element " << i - s.offset;
    }
  }
}

TEST_P(ModelGrad, CheckpointingAndFloatAgree) {
  std::mt19937_64 rng(testing::fresh_seed());
  const ModelConfig c = testing::tiny_config(GetParam().arch, GetParam().tied, 3);
  const std::vector<float> params = testing::tiny_params(c, rng);
  const std::vector<int32_t> ids = testing::random_ids(12, c.vocab, rng);
  std::vector<double> r(ids.size(), 1.0);
  auto attn = model::make_local_attention();
  model::ModelOptions opts;
  opts.attention_backends = {BackendId::Math};
  Model<double> plain(c, params, opts);
  model::ModelOptions ckpt_opts = opts;
  ckpt_opts.checkpoint_layers = {true, false, true};  // both paths in one model
  Model<double> ckpt(c, params, ckpt_opts);
  for (Model<double>* m : {&plain, &ckpt}) {
    m->zero_grads();
    model::sequence_logprobs(*m, ids, *attn, 5, true);
    model::sequence_logprobs_backward(*m, ids, r, *attn, 5);
  }
  // Recomputation runs the same arithmetic in the same order: identical gradients.
  const auto& gp = plain.grads();
  const auto& gc = ckpt.grads();
  ASSERT_EQ(gp.size(), gc.size());
  for (size_t i = 0; i < gp.size(); ++i) ASSERT_EQ(gp[i], gc[i]) << i;

  // fp32 model (default allow-list: whichever CPU backend the selection picks) against fp64: relative L2 error
  // of ~1e-6 is fp32 rounding through a few layers; 1e-4 leaves margin but catches any formula difference.
  Model<float> f32(c, params);
  f32.zero_grads();
  std::vector<float> rf(ids.size(), 1.f);
  model::sequence_logprobs(f32, ids, *attn, 5, true);
  model::sequence_logprobs_backward(f32, ids, rf, *attn, 5);
  const auto& gf = f32.grads();
  double num = 0, den = 0;
  for (size_t i = 0; i < gp.size(); ++i) {
    ASSERT_TRUE(std::isfinite(gf[i])) << i;
    num += (gf[i] - gp[i]) * (gf[i] - gp[i]);
    den += gp[i] * gp[i];
  }
  EXPECT_LT(std::sqrt(num / den), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Arch, ModelGrad,
                         ::testing::Values(Variant{"llama_llama3rope", Arch::Llama, false},
                                           Variant{"qwen2_bias", Arch::Qwen2, false},
                                           Variant{"qwen3_qknorm_tied", Arch::Qwen3, true},
                                           Variant{"mistral", Arch::Mistral, false}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(ModelBatch, TwoRowsEqualTwoSeparateSequences) {
  // forward over [B = 2, S] rows (BSHD attention with batch 2) against each sequence alone.
  std::mt19937_64 rng(testing::fresh_seed());
  const ModelConfig c = testing::tiny_config(Arch::Qwen2);
  Model<float> m(c, testing::tiny_params(c, rng));
  const int64_t S = 10;
  const std::vector<int32_t> a = testing::random_ids(S, c.vocab, rng), b = testing::random_ids(S, c.vocab, rng);
  std::vector<int32_t> tokens(a), positions, targets;
  tokens.insert(tokens.end(), b.begin(), b.end());
  for (int row = 0; row < 2; ++row)
    for (int64_t i = 0; i < S; ++i) {
      positions.push_back(static_cast<int32_t>(i));
      targets.push_back(i + 1 < S ? tokens[row * S + i + 1] : -1);
    }
  auto attn = model::make_local_attention();
  const std::vector<float> both =
      model::model_row_logprobs(m, tokens.data(), positions.data(), targets.data(), 2, S, *attn, 3, false);
  const std::vector<float> la = model::sequence_logprobs(m, a, *attn, 3), lb = model::sequence_logprobs(m, b, *attn, 3);
  for (int64_t i = 0; i + 1 < S; ++i) {
    // Same arithmetic per row; only the GEMM row blocking differs (fp32 sums in another grouping).
    EXPECT_NEAR(both[i], la[i + 1], 1e-5) << i;
    EXPECT_NEAR(both[S + i], lb[i + 1], 1e-5) << i;
  }
  EXPECT_EQ(both[S - 1], 0.f);
  EXPECT_EQ(both[2 * S - 1], 0.f);
}

TEST(ModelBackends, AllowListSelectsAndCannotWiden) {
  std::mt19937_64 rng(testing::fresh_seed());
  const ModelConfig c = testing::tiny_config(Arch::Llama);
  const std::vector<float> params = testing::tiny_params(c, rng);
  const std::vector<int32_t> ids = testing::random_ids(6, c.vocab, rng);
  auto attn = model::make_local_attention();
  for (BackendId only : {BackendId::Flash, BackendId::Math}) {
    model::ModelOptions opts;
    opts.attention_backends = {only};
    Model<float> m(c, params, opts);
    attention::reset_dispatch_counts();
    model::sequence_logprobs(m, ids, *attn, 8);
    const attention::DispatchCounts d = attention::dispatch_counts();
    EXPECT_EQ(d.forward[static_cast<int>(only)], c.layers) << attention::format_dispatch_counts(d);
    EXPECT_EQ(d.total(), c.layers) << attention::format_dispatch_counts(d);
  }
  // An outer scope that allows only flash: a model listing only math finds no backend (no widening).
  model::ModelOptions math_only;
  math_only.attention_backends = {BackendId::Math};
  Model<float> m(c, params, math_only);
  attention::BackendScope outer("test", {BackendId::Flash});
  try {
    model::sequence_logprobs(m, ids, *attn, 8);
    FAIL() << "the model's scope widened the outer one";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("excluded by scope 'test'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ringtrain
