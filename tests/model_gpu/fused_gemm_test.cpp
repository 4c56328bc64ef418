// The fused-epilogue GEMMs of forward-only scoring (model/cuda/fused_gemm.h) against double loops on the same bf16
// inputs. Fresh random inputs, outputs poisoned with NaN. Shapes with tails in every dimension (rows, K, ffn or
// vocabulary not a multiple of the 128 x 128 x 64 tiles) and shapes with more tiles than two per CTA, so that the
// persistent scheduler, the ring's wrap-around and the consumers' hand-over all run.
//
// Bounds, mag = sum |products| of the entry:
//  - each fp32 accumulator: the tensor cores sum 16-wide steps, a chain of k/16 fp32 additions, doubled for their
//    truncating alignment: 2 (k/16 + 2) 2^-24 mag (accumulation_bound);
//  - SwiGLU: that error through silu(g) u (|silu'| <= 1.1), one expf (2 ulp), then one bf16 rounding (2^-8 |ref|);
//  - logprob = z_t - lse: the target logit's error, plus the largest logit error (lse moves by at most that), plus
//    the fp32 exp sums and log (a chain over the row's 32-wide thread packs and tiles: 1e-5 covers it at these
//    widths), plus one fp32 rounding of lse and z_t;
//  - entropy = lse - sum p z: twice the largest logit error plus 1e-5 (1 + max |z|) for the fp32 sums.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "test_util.h"
#ifdef RINGTRAIN_WITH_CUDA
#include "ringtrain/core/cuda/gemm.h"
#include "ringtrain/model/cuda/fused_gemm.h"
#include "ringtrain/model/cuda/gpu_logprobs.h"
#endif

namespace ringtrain {
namespace {

#ifdef RINGTRAIN_WITH_CUDA
using namespace testing::kernels;
namespace mc = model::cuda;

constexpr const char* kNeedsHopper =
    "the fused-epilogue GEMMs need a Hopper GPU (sm_90), and RINGTRAIN_FUSED_EPILOGUES must not be 0";

double accumulation_bound(int64_t k, double magnitude) { return 2 * fp32_sum_bound(k / 16.0 + 2, magnitude); }

// out[r, c] = sum_k a[r, k] b[c, k] in double, and mag[r, c] = sum |a b|.
void matmul_nt(const std::vector<float>& a, const std::vector<float>& b, int64_t m, int64_t n, int64_t k,
               std::vector<double>& out, std::vector<double>& mag) {
  out.assign(static_cast<size_t>(m * n), 0.0), mag.assign(out.size(), 0.0);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < n; ++c) {
      double s = 0, sa = 0;
      for (int64_t i = 0; i < k; ++i) {
        const double p = double(a[r * k + i]) * b[c * k + i];
        s += p, sa += std::fabs(p);
      }
      out[r * n + c] = s, mag[r * n + c] = sa;
    }
}

void check_swiglu(int64_t n, int64_t in, int64_t ffn) {
  std::mt19937_64 rng(testing::fresh_seed());
  TestStream stream;
  const std::vector<float> x = random_bf16_values(n * in, rng), w = random_bf16_values(2 * ffn * in, rng, 0.08);
  std::vector<double> y, mag;
  matmul_nt(x, w, n, 2 * ffn, in, y, mag);
  std::vector<double> ref(static_cast<size_t>(n * ffn));
  std::vector<double> bound(ref.size());
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < ffn; ++j) {
      const double g = y[r * 2 * ffn + j], u = y[r * 2 * ffn + ffn + j];
      const double eg = accumulation_bound(in, mag[r * 2 * ffn + j]);
      const double eu = accumulation_bound(in, mag[r * 2 * ffn + ffn + j]);
      const double silu = g / (1 + std::exp(-g));
      ref[r * ffn + j] = silu * u;
      bound[r * ffn + j] = kBf16Out * std::fabs(ref[r * ffn + j]) + 1.1 * std::fabs(u) * eg + std::fabs(silu) * eu +
                           4e-7 * std::fabs(ref[r * ffn + j]) + 1e-7;
    }
  auto dx = upload_bf16(x), dw = upload_bf16(w);
  DeviceArray<bf16> act(static_cast<size_t>(n * ffn));
  act.poison();
  ASSERT_TRUE(mc::fused_swiglu_fits(act.get(), dx->get(), dw->get(), in, ffn));
  mc::fused_gate_up_swiglu(stream.get(), act.get(), dx->get(), dw->get(), n, in, ffn);
  stream.sync();
  expect_elementwise("fused swiglu " + std::to_string(n) + "x" + std::to_string(in) + "->" + std::to_string(ffn),
                     download(act), ref, [&](size_t i) { return bound[i]; });
}

struct LogprobRef {
  std::vector<double> logprob, entropy, logprob_bound, entropy_bound;
};

LogprobRef logprob_reference(const std::vector<float>& h, const std::vector<float>& w,
                             const std::vector<int32_t>& targets, int64_t n, int64_t in, int64_t vocab) {
  std::vector<double> z, mag;
  matmul_nt(h, w, n, vocab, in, z, mag);
  LogprobRef ref;
  for (int64_t r = 0; r < n; ++r) {
    const double* zr = z.data() + r * vocab;
    double mx = zr[0], s = 0, worst_err = 0, max_abs = 0;
    for (int64_t j = 0; j < vocab; ++j) {
      mx = std::max(mx, zr[j]);
      worst_err = std::max(worst_err, accumulation_bound(in, mag[r * vocab + j]));
      max_abs = std::max(max_abs, std::fabs(zr[j]));
    }
    for (int64_t j = 0; j < vocab; ++j) s += std::exp(zr[j] - mx);
    const double lse = mx + std::log(s);
    double ent = 0;
    for (int64_t j = 0; j < vocab; ++j) ent -= std::exp(zr[j] - lse) * (zr[j] - lse);
    const int32_t t = targets[r];
    ref.logprob.push_back(t < 0 ? 0.0 : zr[t] - lse);
    ref.logprob_bound.push_back(t < 0 ? 0.0
                                      : accumulation_bound(in, mag[r * vocab + t]) + worst_err + 1e-5 +
                                            std::ldexp(std::fabs(lse) + std::fabs(zr[t]), -23));
    ref.entropy.push_back(ent);
    ref.entropy_bound.push_back(2 * worst_err + 1e-5 * (1 + max_abs));
  }
  return ref;
}

std::vector<int32_t> random_targets(int64_t n, int64_t vocab, std::mt19937_64& rng) {
  std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = dist(rng);
  for (int64_t i = 0; i < n; i += 7) t[i] = -1;  // rows with no next token
  t[1] = static_cast<int32_t>(vocab - 1);        // the last column of the last, partial tile
  return t;
}

void check_logprobs(int64_t n, int64_t in, int64_t vocab) {
  std::mt19937_64 rng(testing::fresh_seed());
  TestStream stream;
  const std::vector<float> h = random_bf16_values(n * in, rng), w = random_bf16_values(vocab * in, rng, 0.1);
  const std::vector<int32_t> targets = random_targets(n, vocab, rng);
  const LogprobRef ref = logprob_reference(h, w, targets, n, in, vocab);
  auto dh = upload_bf16(h), dw = upload_bf16(w);
  auto dt = upload(targets);
  DeviceArray<float> out(static_cast<size_t>(n)), entropy(static_cast<size_t>(n));
  DeviceArray<float> scratch(static_cast<size_t>(mc::fused_logprob_scratch_floats(n, vocab)));
  const std::string shape = std::to_string(n) + "x" + std::to_string(in) + "->" + std::to_string(vocab);
  for (const bool with_entropy : {true, false}) {
    out.poison(), entropy.poison(), scratch.poison();
    mc::fused_token_logprobs(stream.get(), out.get(), with_entropy ? entropy.get() : nullptr, dh->get(), dw->get(),
                             dt->get(), n, in, vocab, scratch.get());
    stream.sync();
    expect_elementwise("fused logprobs " + shape, download(out), ref.logprob,
                       [&](size_t i) { return ref.logprob_bound[i]; });
    if (with_entropy)
      expect_elementwise("fused entropy " + shape, download(entropy), ref.entropy,
                         [&](size_t i) { return ref.entropy_bound[i]; });
  }
  // Forward-only scoring takes the fused path by default and the cuBLASLt + log-softmax one with the switch off;
  // both meet the same bounds. On the legacy default stream, where its scratch is allocated and freed.
  mc::Gemm gemm(nullptr);
  for (const char* fused : {"1", "0"}) {
    setenv("RINGTRAIN_FUSED_EPILOGUES", fused, 1);
    out.poison(), entropy.poison();
    mc::token_logprobs(gemm, out.get(), dh->get(), dw->get(), dt->get(), n, in, vocab, /*chunk_tokens=*/97,
                       entropy.get(), /*forward_only=*/true);
    cuda_ok(cudaDeviceSynchronize(), "token_logprobs");
    unsetenv("RINGTRAIN_FUSED_EPILOGUES");
    expect_elementwise(std::string("token_logprobs, fused=") + fused + " " + shape, download(out), ref.logprob,
                       [&](size_t i) { return ref.logprob_bound[i]; });
    expect_elementwise(std::string("token_logprobs entropy, fused=") + fused + " " + shape, download(entropy),
                       ref.entropy, [&](size_t i) { return ref.entropy_bound[i]; });
  }
}

#endif  // RINGTRAIN_WITH_CUDA

#define RT_REQUIRE_HOPPER() \
  RT_REQUIRE_GPU();         \
  RT_GPU_ONLY(if (!mc::fused_epilogues_enabled()) GTEST_SKIP() << kNeedsHopper)

TEST(GpuFusedGemm, SwigluTails) {
  RT_REQUIRE_HOPPER();
  RT_GPU_ONLY(check_swiglu(300, 200, 136));
}
TEST(GpuFusedGemm, SwigluManyTilesPerCta) {
  RT_REQUIRE_HOPPER();
  RT_GPU_ONLY(check_swiglu(2048, 256, 1536));
}
TEST(GpuFusedGemm, LogprobsTails) {
  RT_REQUIRE_HOPPER();
  RT_GPU_ONLY(check_logprobs(300, 200, 1000));
}
TEST(GpuFusedGemm, LogprobsManyTilesPerCta) {
  RT_REQUIRE_HOPPER();
  RT_GPU_ONLY(check_logprobs(1100, 512, 5000));
}

}  // namespace
}  // namespace ringtrain
