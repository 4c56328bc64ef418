// The additive attention bias (params.h: PyTorch SDPA attn_mask semantics) on the CPU: the fp64 math backend against
// a naive computation written here, central differences of its backward with a bias in place, broadcasting, the
// validation messages, and the backends that decline a bias.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "attention_test_util.h"
#include "ringtrain/attention/selection.h"
#include "ringtrain/core/error.h"

namespace ringtrain {
namespace {

using attention::AttnBackwardArgs;
using attention::AttnForwardArgs;
using attention::AttnParams;
using attention::BackendId;
using attention::MaskType;

constexpr double kInf = std::numeric_limits<double>::infinity();

const attention::Backend& cpu_math() { return *attention::find_backend(BackendId::Math, DeviceKind::CPU); }

// bias [bb, bh, Sq, Skv] fp64: N(0, 1), about 1 in 8 entries -inf, and every key of query row `hidden_row` -inf.
Tensor make_bias(int64_t bb, int64_t bh, int64_t sq, int64_t skv, int64_t hidden_row, std::mt19937_64& rng) {
  Tensor b = Tensor::empty({bb, bh, sq, skv}, DType::F64);
  testing::fill_normal(b, rng);
  std::uniform_int_distribution<int> pick(0, 7);
  for (int64_t i = 0; i < b.numel(); ++i)
    if (pick(rng) == 0 || (i / skv) % sq == hidden_row) b.ptr<double>()[i] = -kInf;
  return b;
}

struct Outputs {
  Tensor o, lse, dq, dk, dv;
};

Outputs run_math(const testing::AttnProblem& pr, const TensorView& bias) {
  const AttnParams& p = pr.p;
  Outputs r;
  r.o = Tensor::empty({p.batch, p.seqlen_q, p.heads_q, p.head_dim}, DType::F64);
  r.lse = Tensor::empty({p.batch, p.heads_q, p.seqlen_q}, DType::F32);
  r.dq = Tensor::empty({p.batch, p.seqlen_q, p.heads_q, p.head_dim}, DType::F64);
  r.dk = Tensor::empty({p.batch, p.seqlen_kv, p.heads_kv, p.head_dim}, DType::F64);
  r.dv = Tensor::empty({p.batch, p.seqlen_kv, p.heads_kv, p.head_dim}, DType::F64);
  for (const Tensor* t : {&r.o, &r.lse, &r.dq, &r.dk, &r.dv}) testing::poison(*t);
  AttnForwardArgs f{pr.q, pr.k, pr.v, r.o, r.lse};
  f.bias = bias;
  attention::forward(p, f);
  AttnBackwardArgs b{pr.q, pr.k, pr.v, r.o, pr.dout, r.lse, r.dq, r.dk, r.dv};
  b.bias = bias;
  attention::backward(p, b);
  return r;
}

double at(const Tensor& t, std::initializer_list<int64_t> idx) { return *static_cast<double*>(t.view().at(idx)); }

// O and LSE straight from the definition: s_j = scale q.k_j + bias_ij over the keys the mask shows, softmax.
TEST(AttentionBias, MathMatchesNaiveDefinition) {
  std::mt19937_64 rng(testing::fresh_seed());
  const int64_t B = 2, Hq = 4, Hkv = 2, D = 8, Sq = 7, Skv = 11;
  for (MaskType mask : {MaskType::None, MaskType::CausalTopLeft, MaskType::CausalBottomRight}) {
    testing::AttnProblem pr = testing::make_problem(B, Hq, Hkv, D, Sq, Skv, mask, DType::F64, rng);
    pr.p.has_bias = true;
    const Tensor bias = make_bias(B, Hq, Sq, Skv, /*hidden_row=*/2, rng);
    attention::BackendScope only_math("test", {BackendId::Math});
    const Outputs r = run_math(pr, bias);
    const double scale = pr.p.scale();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < Hq; ++h)
        for (int64_t i = 0; i < Sq; ++i) {
          const int64_t lim = attention::key_limit(mask, i, Sq, Skv), hk = h / (Hq / Hkv);
          std::vector<double> s(Skv, -kInf);
          double m = -kInf;
          for (int64_t j = 0; j < lim; ++j) {
            double dot = 0;
            for (int64_t c = 0; c < D; ++c) dot += at(pr.q, {b, i, h, c}) * at(pr.k, {b, j, hk, c});
            s[j] = scale * dot + at(bias, {b, h, i, j});
            m = std::max(m, s[j]);
          }
          const float lse = *static_cast<float*>(r.lse.view().at({b, h, i}));
          if (m == -kInf) {  // every key hidden or masked: LSE -inf, O 0
            EXPECT_EQ(lse, -std::numeric_limits<float>::infinity()) << "b " << b << " h " << h << " i " << i;
            for (int64_t c = 0; c < D; ++c) EXPECT_EQ(at(r.o, {b, i, h, c}), 0.0);
            continue;
          }
          double l = 0;
          for (int64_t j = 0; j < Skv; ++j) l += std::exp(s[j] - m);
          // LSE is stored in fp32: relative 2^-24 of |LSE| < 10.
          EXPECT_NEAR(lse, m + std::log(l), 1e-6) << "b " << b << " h " << h << " i " << i;
          for (int64_t c = 0; c < D; ++c) {
            double o = 0;
            for (int64_t j = 0; j < Skv; ++j) o += std::exp(s[j] - m) / l * at(pr.v, {b, j, hk, c});
            EXPECT_NEAR(at(r.o, {b, i, h, c}), o, 1e-12) << "fp64 throughout";
          }
        }
    // A row whose keys are all hidden has no gradient, and no NaN reaches any gradient.
    for (int64_t c = 0; c < D; ++c) EXPECT_EQ(at(r.dq, {0, 2, 0, c}), 0.0);
    for (const Tensor* g : {&r.dq, &r.dk, &r.dv}) EXPECT_EQ(testing::max_abs_error(*g, *g), 0.0) << "NaN in a gradient";
  }
}

double loss(const testing::AttnProblem& pr, const TensorView& bias) {
  const Outputs r = run_math(pr, bias);
  double l = 0;
  for (int64_t i = 0; i < r.o.numel(); ++i) l += r.o.ptr<double>()[i] * pr.dout.ptr<double>()[i];
  return l;
}

// L = sum(W * O), dO = W: dL/dx against central differences for sampled elements of Q, K, V, with a bias that hides
// some keys and one whole row. Tolerance as in math_gradcheck_test.cpp (fp32 LSE: 1e-6 relative).
TEST(AttentionBias, MathBackwardMatchesCentralDifferences) {
  std::mt19937_64 rng(testing::fresh_seed());
  testing::AttnProblem pr = testing::make_problem(1, 4, 2, 8, 9, 11, MaskType::CausalBottomRight, DType::F64, rng);
  pr.p.has_bias = true;
  const Tensor bias = make_bias(1, 1, 9, 11, /*hidden_row=*/4, rng);  // broadcast over heads
  attention::BackendScope only_math("test", {BackendId::Math});
  const Outputs r = run_math(pr, bias);
  const double h = 1e-5;
  std::uniform_int_distribution<int64_t> pick(0, 1 << 30);
  for (auto [x, grad, name] : {std::tuple{&pr.q, &r.dq, "dQ"}, {&pr.k, &r.dk, "dK"}, {&pr.v, &r.dv, "dV"}}) {
    double worst = 0, largest = 0;
    for (int n = 0; n < 24; ++n) {
      const int64_t i = pick(rng) % x->numel();
      double& xi = x->ptr<double>()[i];
      const double saved = xi;
      xi = saved + h;
      const double up = loss(pr, bias);
      xi = saved - h;
      const double down = loss(pr, bias);
      xi = saved;
      const double fd = (up - down) / (2 * h), an = grad->ptr<double>()[i];
      ASSERT_TRUE(std::isfinite(an)) << name << " element " << i;
      worst = std::max(worst, std::fabs(fd - an));
      largest = std::max(largest, std::fabs(an));
    }
    EXPECT_LE(worst, 1e-6 * std::max(1.0, largest)) << name << " (largest |grad| " << largest << ")";
  }
}

// A [1, 1, Sq, Skv] bias, the same values as a stride-0 [B, Hq, Sq, Skv] view, and materialised: identical results.
TEST(AttentionBias, BroadcastEqualsMaterialised) {
  std::mt19937_64 rng(testing::fresh_seed());
  const int64_t B = 2, Hq = 4, Sq = 9, Skv = 9;
  testing::AttnProblem pr = testing::make_problem(B, Hq, 2, 16, Sq, Skv, MaskType::CausalTopLeft, DType::F64, rng);
  pr.p.has_bias = true;
  const Tensor small = make_bias(1, 1, Sq, Skv, -1, rng);
  TensorView strided = small.view();
  strided.shape = {B, Hq, Sq, Skv};
  strided.stride = {0, 0, Skv, 1};
  Tensor full64 = Tensor::empty({B, Hq, Sq, Skv}, DType::F64);
  copy(full64, strided);
  attention::BackendScope only_math("test", {BackendId::Math});
  const Outputs a = run_math(pr, small), b = run_math(pr, strided), c = run_math(pr, full64);
  for (auto [x, y] : {std::pair{&a.o, &b.o}, {&a.o, &c.o}, {&a.dq, &b.dq}, {&a.dq, &c.dq}, {&a.dk, &c.dk},
                      {&a.dv, &c.dv}})
    EXPECT_EQ(testing::max_abs_error(*x, *y), 0.0);
}

template <typename Args>
std::string error_of(const AttnParams& p, const Args& a) {
  try {
    attention::validate(p, a);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(AttentionBias, ValidationNamesTheBias) {
  std::mt19937_64 rng(testing::fresh_seed());
  testing::AttnProblem pr = testing::make_problem(2, 4, 2, 16, 10, 12, MaskType::None, DType::F32, rng);
  Tensor o = Tensor::empty({2, 10, 4, 16}, DType::F32), lse = Tensor::empty({2, 4, 10}, DType::F32);
  Tensor bias = Tensor::empty({2, 4, 10, 12}, DType::F32), bad = Tensor::empty({2, 3, 10, 12}, DType::F32);
  AttnForwardArgs f{pr.q, pr.k, pr.v, o, lse};
  f.bias = bias;
  EXPECT_NE(error_of(pr.p, f).find("params do not say has_bias"), std::string::npos) << error_of(pr.p, f);
  AttnParams p = pr.p;
  p.has_bias = true;
  EXPECT_EQ(error_of(p, f), "");
  f.bias = bad;
  EXPECT_NE(error_of(p, f).find("'bias' is [2, 3, 10, 12] fp32 cpu, expected [2 or 1, 4 or 1, 10, 12]"),
            std::string::npos)
      << error_of(p, f);
  f.bias = {};
  EXPECT_NE(error_of(p, f).find("'bias' is missing"), std::string::npos) << error_of(p, f);
  AttnBackwardArgs b{pr.q, pr.k, pr.v, o, pr.dout, lse, o, pr.k, pr.v};
  EXPECT_NE(error_of(p, b).find("'bias' is missing"), std::string::npos) << error_of(p, b);
  EXPECT_NE(p.describe().find(" bias"), std::string::npos) << p.describe();
  EXPECT_NE(p.key(), pr.p.key());
}

TEST(AttentionBias, PackedCallsRejectABias) {
  AttnParams p;
  p.packed = true;
  p.has_bias = true;
  p.batch = 1;
  p.heads_q = p.heads_kv = 1;
  p.head_dim = 8;
  p.seqlen_q = p.seqlen_kv = 4;
  Tensor q = Tensor::zeros({4, 1, 8}, DType::F32), lse = Tensor::zeros({1, 4}, DType::F32);
  Tensor cu = Tensor::zeros({2}, DType::I32), bias = Tensor::zeros({1, 1, 4, 4}, DType::F32);
  cu.ptr<int32_t>()[1] = 4;
  AttnForwardArgs f{q, q, q, q, lse, cu, cu};
  f.bias = bias;
  EXPECT_NE(error_of(p, f).find("packed (THD)"), std::string::npos) << error_of(p, f);
}

// CPU flash declines a bias with a reason; selection then runs math.
TEST(AttentionBias, CpuFlashDeclinesAndMathIsSelected) {
  attention::set_root_backends(attention::default_backends(), "test default");
  AttnParams p;
  p.heads_q = p.heads_kv = 2;
  p.head_dim = 16;
  p.seqlen_q = p.seqlen_kv = 32;
  p.has_bias = true;
  const auto reasons = attention::find_backend(BackendId::Flash, DeviceKind::CPU)->unsupported_reasons(p);
  ASSERT_EQ(reasons.size(), 1u);
  EXPECT_NE(reasons[0].find("additive bias"), std::string::npos) << reasons[0];
  EXPECT_TRUE(cpu_math().unsupported_reasons(p).empty());
  EXPECT_EQ(attention::select(p).id(), BackendId::Math) << attention::explain(p).report();
}

}  // namespace
}  // namespace ringtrain
