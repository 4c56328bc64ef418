// Every layer's backward against central finite differences of its forward, in fp64 (the layers are templates;
// the float instantiation is the same code). Loss = Σ r ∘ y with random r, so dy = r.
// Step h = 1e-6: truncation error ~h²·|f'''| ≈ 1e-12 and rounding ~1e-16/h ≈ 1e-10, so 1e-7 absolute plus
// 1e-7 relative is a tolerance a wrong formula cannot meet.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "ringtrain/core/error.h"
#include "ringtrain/model/layers.h"
#include "ringtrain/model/logprobs.h"
#include "test_util.h"

namespace ringtrain {
namespace {

using Vec = std::vector<double>;
using model::RopeConfig;

Vec randn(size_t n, std::mt19937_64& rng, double sd = 1.0) {
  std::normal_distribution<double> d(0, sd);
  Vec v(n);
  for (double& x : v) x = d(rng);
  return v;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Checks grad against finite differences of loss() with respect to every element of x.
void expect_fd(const char* what, Vec& x, const Vec& grad, const std::function<double()>& loss) {
  ASSERT_EQ(x.size(), grad.size()) << what;
  const double h = 1e-6;
  for (size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    const double up = loss();
    x[i] = keep - h;
    const double down = loss();
    x[i] = keep;
    const double fd = (up - down) / (2 * h);
    ASSERT_TRUE(std::isfinite(grad[i])) << what << "[" << i << "]";
    ASSERT_NEAR(grad[i], fd, 1e-7 + 1e-7 * std::fabs(fd)) << what << "[" << i << "]";
  }
}

TEST(LayerGrad, Linear) {
  std::mt19937_64 rng(testing::fresh_seed());
  const int64_t n = 5, in = 7, out = 6;
  Vec x = randn(n * in, rng), w = randn(out * in, rng), b = randn(out, rng), r = randn(n * out, rng);
  auto loss = [&] {
    Vec y(n * out, NAN);
    model::linear_forward(y.data(), x.data(), w.data(), b.data(), n, in, out);
    return dot(y, r);
  };
  // Gradients accumulate: start from a known offset and subtract it.
  Vec dx(n * in, 0.5), dw(out * in, -0.25), db(out, 2.0);
  model::linear_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), n, in, out);
  for (double& v : dx) v -= 0.5;
  for (double& v : dw) v += 0.25;
  for (double& v : db) v -= 2.0;
  expect_fd("dx", x, dx, loss);
  expect_fd("dw", w, dw, loss);
  expect_fd("db", b, db, loss);
}

TEST(LayerGrad, LinearFloatMatchesDouble) {
  // The blocked GEMM path (4-row blocks plus a remainder) in fp32 against a naive fp64 product.
  std::mt19937_64 rng(testing::fresh_seed());
  const int64_t n = 11, in = 37, out = 70;
  const Vec x = randn(n * in, rng), w = randn(out * in, rng);
  std::vector<float> xf(x.begin(), x.end()), wf(w.begin(), w.end()), y(n * out, NAN);
  model::linear_forward(y.data(), xf.data(), wf.data(), static_cast<const float*>(nullptr), n, in, out);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t o = 0; o < out; ++o) {
      double ref = 0;
      for (int64_t k = 0; k < in; ++k) ref += static_cast<double>(xf[i * in + k]) * wf[o * in + k];
      // fp32 dot of 37 terms of size ~1: rounding ~37 · 6e-8 · |terms| < 1e-4.
      ASSERT_NEAR(y[i * out + o], ref, 1e-4) << i << "," << o;
    }
}

TEST(LayerGrad, RmsNorm) {
  std::mt19937_64 rng(testing::fresh_seed());
  const int64_t rows = 5, dim = 8;
  Vec x = randn(rows * dim, rng), w = randn(dim, rng), r = randn(rows * dim, rng);
  auto loss = [&] {
    Vec y(rows * dim, NAN), rstd(rows, NAN);
    model::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), rows, dim, 1e-5);
    return dot(y, r);
  };
  Vec y(rows * dim), rstd(rows), dx(rows * dim, 0.0), dw(dim, 0.0);
  model::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), rows, dim, 1e-5);
  model::rmsnorm_backward(dx.data(), dw.data(), r.data(), x.data(), w.data(), rstd.data(), rows, dim);
  expect_fd("dx", x, dx, loss);
  expect_fd("dw", w, dw, loss);
}

TEST(LayerGrad, Rope) {
  std::mt19937_64 rng(testing::fresh_seed());
  const int64_t tokens = 5, heads = 3, dim = 8;
  RopeConfig rope;
  rope.theta = 500000;
  rope.llama3 = true, rope.factor = 8, rope.low_freq_factor = 1, rope.high_freq_factor = 4;
  rope.original_max_position = 32;
  const std::vector<float> inv = model::rope_inv_freq(rope, dim);
  std::vector<int32_t> pos = {0, 3, 17, 1000, 77};
  Vec x = randn(tokens * heads * dim, rng), r = randn(tokens * heads * dim, rng);
  auto loss = [&] {
    Vec y = x;
    model::rope_forward(y.data(), pos.data(), inv, tokens, heads, dim);
    return dot(y, r);
  };
  Vec dx = r;
  model::rope_backward(dx.data(), pos.data(), inv, tokens, heads, dim);
  expect_fd("dx", x, dx, loss);
  // Position 0 is the identity; a rotation keeps norms.
  Vec y = x;
  model::rope_forward(y.data(), pos.data(), inv, tokens, heads, dim);
  for (int64_t j = 0; j < heads * dim; ++j) EXPECT_EQ(y[j], x[j]);
  EXPECT_NEAR(dot(y, y), dot(x, x), 1e-9 * dot(x, x));
}

TEST(LayerGrad, Llama3InvFreqBands) {
  // Independent of the implementation: wavelengths above original/low are divided by factor, below
  // original/high kept, and the band between interpolated (strictly between the two).
  RopeConfig plain, scaled;
  plain.theta = scaled.theta = 500000;
  scaled.llama3 = true, scaled.factor = 8, scaled.low_freq_factor = 1, scaled.high_freq_factor = 4;
  scaled.original_max_position = 64;
  const std::vector<float> a = model::rope_inv_freq(plain, 32), b = model::rope_inv_freq(scaled, 32);
  int bands[3] = {0, 0, 0};
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i], std::pow(500000.0, -2.0 * i / 32), 1e-7 * a[i]);
    const double wavelen = 2 * M_PI / a[i];
    if (wavelen < 64 / 4.0) {
      EXPECT_EQ(b[i], a[i]);
      ++bands[0];
    } else if (wavelen > 64 / 1.0) {
      EXPECT_NEAR(b[i], a[i] / 8, 1e-7 * a[i]);
      ++bands[2];
    } else {
      EXPECT_LT(b[i], a[i]);
      EXPECT_GT(b[i], a[i] / 8);
      ++bands[1];
    }
  }
  EXPECT_GT(bands[0], 0);
  EXPECT_GT(bands[1], 0);
  EXPECT_GT(bands[2], 0);
}

TEST(LayerGrad, SwiGlu) {
  std::mt19937_64 rng(testing::fresh_seed());
  const int64_t n = 20;
  Vec g = randn(n, rng, 2.0), u = randn(n, rng), r = randn(n, rng);
  auto loss = [&] {
    Vec h(n, NAN);
    model::swiglu_forward(h.data(), g.data(), u.data(), n);
    return dot(h, r);
  };
  Vec dg(n, NAN), du(n, NAN);
  model::swiglu_backward(dg.data(), du.data(), r.data(), g.data(), u.data(), n);
  expect_fd("dgate", g, dg, loss);
  expect_fd("dup", u, du, loss);
}

TEST(LayerGrad, Embedding) {
  std::mt19937_64 rng(testing::fresh_seed());
  const int64_t vocab = 10, dim = 4;
  const std::vector<int32_t> tokens = {3, 7, 3, 0, 9, 3};  // repeats accumulate
  const int64_t n = static_cast<int64_t>(tokens.size());
  Vec table = randn(vocab * dim, rng), r = randn(n * dim, rng);
  auto loss = [&] {
    Vec x(n * dim, NAN);
    model::embedding_forward(x.data(), tokens.data(), table.data(), n, dim, vocab);
    return dot(x, r);
  };
  Vec dt(vocab * dim, 0.0);
  model::embedding_backward(dt.data(), tokens.data(), r.data(), n, dim);
  expect_fd("dtable", table, dt, loss);
  const std::vector<int32_t> bad = {1, 10};
  Vec x(2 * dim);
  try {
    model::embedding_forward(x.data(), bad.data(), table.data(), 2, dim, vocab);
    FAIL() << "token 10 of a vocabulary of 10 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 10 at index 1"), std::string::npos) << e.what();
  }
}

// Naive log-softmax over the full logits in fp64: the reference for the chunked version.
Vec naive_logprobs(const Vec& hidden, const Vec& head, const std::vector<int32_t>& targets, int64_t H, int64_t V) {
  Vec out(targets.size());
  for (size_t i = 0; i < targets.size(); ++i) {
    Vec z(V);
    double mx = -INFINITY;
    for (int64_t v = 0; v < V; ++v) {
      z[v] = 0;
      for (int64_t k = 0; k < H; ++k) z[v] += hidden[i * H + k] * head[v * H + k];
      mx = std::max(mx, z[v]);
    }
    double s = 0;
    for (double zv : z) s += std::exp(zv - mx);
    out[i] = targets[i] < 0 ? 0.0 : z[targets[i]] - mx - std::log(s);
  }
  return out;
}

TEST(LayerGrad, ChunkedLogprobsForwardAndBackward) {
  std::mt19937_64 rng(testing::fresh_seed());
  const int64_t n = 7, H = 6, V = 11;
  Vec hidden = randn(n * H, rng), head = randn(V * H, rng), r = randn(n, rng);
  const std::vector<int32_t> targets = {4, 0, -1, 10, 4, 7, -1};
  const Vec ref = naive_logprobs(hidden, head, targets, H, V);
  for (int64_t chunk : {1, 3, 7, 100}) {
    Vec out(n, NAN);
    model::token_logprobs(out.data(), hidden.data(), head.data(), targets.data(), n, H, V, chunk);
    for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(out[i], ref[i], 1e-12) << "chunk " << chunk << " row " << i;
  }
  auto loss = [&] {
    Vec out(n, NAN);
    model::token_logprobs(out.data(), hidden.data(), head.data(), targets.data(), n, H, V, 3);
    return dot(out, r);
  };
  Vec dh(n * H, 0.0), dw(V * H, 0.0);
  model::token_logprobs_backward(dh.data(), dw.data(), r.data(), hidden.data(), head.data(), targets.data(), n, H, V, 3);
  for (int64_t k = 0; k < H; ++k) {  // rows without a target get no gradient
    EXPECT_EQ(dh[2 * H + k], 0.0);
    EXPECT_EQ(dh[6 * H + k], 0.0);
  }
  expect_fd("d_hidden", hidden, dh, loss);
  expect_fd("d_lm_head", head, dw, loss);
}

}  // namespace
}  // namespace ringtrain
