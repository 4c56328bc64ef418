// Finite-difference check of the math backend's backward in fp64: for the scalar loss L = sum(W * O) with a fixed
// random W, dO = W, and every sampled element x of Q, K, V must satisfy dL/dx ~ (L(x+h) - L(x-h)) / 2h.
#include <gtest/gtest.h>

#include <cmath>

#include "attention_test_util.h"

namespace ringtrain {
namespace {

using attention::MaskType;

double loss(const attention::Backend& be, const testing::AttnProblem& pr) {
  testing::AttnResult r = testing::run_backend(be, pr, DType::F64);
  double l = 0;
  for (int64_t i = 0; i < r.o.numel(); ++i) l += r.o.ptr<double>()[i] * pr.dout.ptr<double>()[i];
  return l;
}

class MathGradcheck : public ::testing::TestWithParam<MaskType> {};

TEST_P(MathGradcheck, MatchesCentralDifferences) {
  const auto& be = *attention::find_backend(attention::BackendId::Math, DeviceKind::CPU);
  std::mt19937_64 rng(testing::fresh_seed());
  testing::AttnProblem pr = testing::make_problem(1, 4, 2, 8, 9, 11, GetParam(), DType::F64, rng);
  testing::AttnResult r = testing::run_backend(be, pr, DType::F64);
  // Central differences in fp64 with h = 1e-5: truncation error ~h^2 * |f'''| ~ 1e-10, rounding ~1e-16 / h ~ 1e-11.
  // The backward reads P = exp(S - LSE) from the LSE, which the project stores in fp32: an absolute LSE error of
  // |LSE| * 2^-24 (~3e-7 for |LSE| < 5) is a relative error of P of the same size, hence 1e-6 relative.
  const double h = 1e-5;
  std::uniform_int_distribution<int64_t> pick(0, 1 << 30);
  for (auto [x, grad, name] : {std::tuple{&pr.q, &r.dq, "dQ"}, {&pr.k, &r.dk, "dK"}, {&pr.v, &r.dv, "dV"}}) {
    double worst = 0, scale = 0;
    for (int n = 0; n < 24; ++n) {
      const int64_t i = pick(rng) % x->numel();
      double& xi = x->ptr<double>()[i];
      const double saved = xi;
      xi = saved + h;
      const double up = loss(be, pr);
      xi = saved - h;
      const double down = loss(be, pr);
      xi = saved;
      const double fd = (up - down) / (2 * h), an = grad->ptr<double>()[i];
      ASSERT_TRUE(std::isfinite(an)) << name << " element " << i;
      worst = std::max(worst, std::fabs(fd - an));
      scale = std::max(scale, std::fabs(an));
    }
    EXPECT_LE(worst, 1e-6 * std::max(1.0, scale)) << name << " (largest |grad| " << scale << ")";
  }
}

INSTANTIATE_TEST_SUITE_P(Masks, MathGradcheck,
                         ::testing::Values(MaskType::None, MaskType::CausalTopLeft, MaskType::CausalBottomRight));

}  // namespace
}  // namespace ringtrain
