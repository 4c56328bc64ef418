// The GPU model's small kernels (model/cuda/layer_kernels.h) against the CPU layers of model/layers.h run in double
// on the same bf16-rounded inputs. Fresh random inputs every run, outputs poisoned with NaN, per-element bounds
// (kernel_test_util.h):
//  - bf16 outputs: 2^-8 |ref| (one bf16 rounding, unit roundoff 2^-9, with room for the fp32 math before it) plus an
//    absolute floor where fp32 terms can cancel, stated at each check;
//  - fp32 sums (weight and embedding gradients, log-sum-exp): the worst case of the kernel's chain of fp32 additions,
//    (chain + 2) 2^-24 sum|terms|;
//  - copies (embedding rows, v heads, rows without a target): exact.
// Sizes: rows that are not a multiple of any block, dims 64/128/2048 (packed loads) and odd ones (scalar path).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernel_test_util.h"
#include "ringtrain/model/layers.h"
#include "test_util.h"
#ifdef RINGTRAIN_WITH_CUDA
#include "ringtrain/model/cuda/layer_kernels.h"
#endif

namespace ringtrain {
namespace {

#ifdef RINGTRAIN_WITH_CUDA
using namespace testing::kernels;
namespace mc = model::cuda;

constexpr float kEps = 1e-6f;

std::vector<int32_t> random_ints(size_t n, int32_t lo, int32_t hi, std::mt19937_64& rng) {
  std::uniform_int_distribution<int32_t> dist(lo, hi);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = dist(rng);
  return v;
}

std::vector<double> abs_of(const std::vector<float>& v) {
  std::vector<double> a(v.size());
  for (size_t i = 0; i < v.size(); ++i) a[i] = std::fabs(v[i]);
  return a;
}

// Tokens from the first `used` rows of a `vocab`-row table (so that n > used repeats tokens and the last rows are
// never looked up: their gradient must stay as it was).
void check_embedding(int64_t n, int64_t dim, int64_t vocab, int32_t used) {
  std::mt19937_64 rng(testing::fresh_seed());
  TestStream stream;
  const std::vector<int32_t> tokens = random_ints(n, 0, used - 1, rng);
  const std::vector<float> table = random_bf16_values(vocab * dim, rng), dx = random_bf16_values(n * dim, rng);
  const std::vector<float> dtable0 = random_f32_values(vocab * dim, rng);
  auto d_tokens = upload(tokens);
  auto d_table = upload_bf16(table), d_dx = upload_bf16(dx);
  auto d_dtable = upload(dtable0);
  DeviceArray<bf16> d_x(n * dim);
  d_x.poison();
  mc::embedding_forward(stream.get(), d_x.get(), d_tokens->get(), d_table->get(), n, dim);
  mc::embedding_backward(stream.get(), d_dtable->get(), d_tokens->get(), d_dx->get(), n, dim);
  stream.sync();

  const std::vector<double> table_d = to_double(table), dx_d = to_double(dx);
  std::vector<double> x_ref(n * dim), dtable_ref = to_double(dtable0), magnitude = abs_of(dtable0);
  model::embedding_forward(x_ref.data(), tokens.data(), table_d.data(), n, dim, vocab);
  model::embedding_backward(dtable_ref.data(), tokens.data(), dx_d.data(), n, dim);
  const std::vector<double> abs_dx = abs_of(dx);
  model::embedding_backward(magnitude.data(), tokens.data(), abs_dx.data(), n, dim);
  std::vector<double> uses(vocab, 0.0);
  for (int32_t t : tokens) uses[t] += 1;

  expect_elementwise("embedding forward", download(d_x), x_ref, [](size_t) { return 0.0; });
  // One fp32 atomic per use of a row, in any order.
  expect_elementwise("embedding backward", download(*d_dtable), dtable_ref,
                     [&](size_t i) { return fp32_sum_bound(uses[i / dim], magnitude[i]); });
}

#endif  // RINGTRAIN_WITH_CUDA

TEST(GpuLayerKernels, EmbeddingDim64RepeatedTokens) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_embedding(1000, 64, 9, 7));
}
TEST(GpuLayerKernels, EmbeddingDim2048RepeatedTokens) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_embedding(300, 2048, 50, 40));
}
TEST(GpuLayerKernels, EmbeddingOddDim) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_embedding(333, 13, 9, 7));
}

#ifdef RINGTRAIN_WITH_CUDA
void check_rmsnorm(int64_t rows, int64_t dim, bool accumulate) {
  std::mt19937_64 rng(testing::fresh_seed());
  TestStream stream;
  const std::vector<float> x = random_bf16_values(rows * dim, rng), w = random_bf16_values(dim, rng, 0.2, 1.0);
  const std::vector<float> dy = random_bf16_values(rows * dim, rng), dx0 = random_bf16_values(rows * dim, rng);
  const std::vector<float> dw0 = random_f32_values(dim, rng);
  const std::vector<double> x_d = to_double(x), w_d = to_double(w), dy_d = to_double(dy);

  std::vector<double> y_ref(rows * dim), rstd_ref(rows);
  model::rmsnorm_forward(y_ref.data(), rstd_ref.data(), x_d.data(), w_d.data(), rows, dim, kEps);
  // The backward gets the reference rstd rounded to fp32 (what a forward saves), the same values on both sides.
  std::vector<float> rstd_f(rstd_ref.begin(), rstd_ref.end());
  const std::vector<double> rstd_fd = to_double(rstd_f);
  std::vector<double> dx_ref = accumulate ? to_double(dx0) : std::vector<double>(rows * dim, 0.0);
  std::vector<double> dw_ref = to_double(dw0);
  model::rmsnorm_backward(dx_ref.data(), dw_ref.data(), dy_d.data(), x_d.data(), w_d.data(), rstd_fd.data(), rows, dim);
  std::vector<double> dw_mag = abs_of(dw0), scratch(rows * dim, 0.0);
  const std::vector<double> abs_dy = abs_of(dy), abs_x = abs_of(x);
  model::rmsnorm_backward(scratch.data(), dw_mag.data(), abs_dy.data(), abs_x.data(), w_d.data(), rstd_fd.data(), rows,
                          dim);

  auto d_x = upload_bf16(x), d_w = upload_bf16(w), d_dy = upload_bf16(dy), d_dx = upload_bf16(dx0);
  auto d_rstd_in = upload(rstd_f);
  auto d_dw = upload(dw0);
  DeviceArray<bf16> d_y(rows * dim);
  DeviceArray<float> d_rstd(rows);
  d_y.poison(), d_rstd.poison();
  if (!accumulate) d_dx->poison();
  mc::rmsnorm_forward(stream.get(), d_y.get(), d_rstd.get(), d_x->get(), d_w->get(), rows, dim, kEps);
  mc::rmsnorm_backward(stream.get(), d_dx->get(), accumulate, d_dw->get(), d_dy->get(), d_x->get(), d_w->get(),
                       d_rstd_in->get(), rows, dim);
  stream.sync();

  // rstd: fp32 sum of squares along a lane's dim/32 values and 5 shuffle levels, then sqrt and a division.
  expect_elementwise("rmsnorm rstd", download(d_rstd), rstd_ref,
                     [&](size_t i) { return fp32_sum_bound(dim / 32.0 + 8, rstd_ref[i]); });
  expect_elementwise("rmsnorm y", download(d_y), y_ref, bf16_bound(y_ref, 1e-6));
  // dx = r w dy - x r^3 mean(w dy x) cancels: the fp32 row dot (chain dim/32 + 5 over sum|w dy x| <= ~dim) scaled by
  // r^3 / dim and |x| <= ~5 stays below 1e-4.
  expect_elementwise(accumulate ? "rmsnorm dx (accumulated)" : "rmsnorm dx", download(*d_dx), dx_ref,
                     bf16_bound(dx_ref, 1e-4));
  // dw: shared-memory atomics over the block's rows, then one global atomic per block (<= rows + blocks adds).
  expect_elementwise("rmsnorm dw", download(*d_dw), dw_ref,
                     [&](size_t i) { return fp32_sum_bound(2.0 * rows, 2 * dw_mag[i]); });
}

#endif  // RINGTRAIN_WITH_CUDA

TEST(GpuLayerKernels, RmsNormDim64) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_rmsnorm(1000, 64, false));
}
TEST(GpuLayerKernels, RmsNormDim2048Accumulate) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_rmsnorm(1000, 2048, true));
}
TEST(GpuLayerKernels, RmsNormDim2048Overwrite) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_rmsnorm(999, 2048, false));
}
TEST(GpuLayerKernels, RmsNormDim1536Accumulate) {  // odd row count
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_rmsnorm(517, 1536, true));
}
TEST(GpuLayerKernels, RmsNormDim4096) {  // the widest rows with a shared slice per warp at 2 blocks per SM
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_rmsnorm(300, 4096, false));
}
TEST(GpuLayerKernels, RmsNormOddDim) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_rmsnorm(333, 13, true));
}
// 64 KiB of shared weight-gradient partial: the kernel has to opt in to more than 48 KiB.
TEST(GpuLayerKernels, RmsNormDim16384) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_rmsnorm(40, 16384, false));
}

#ifdef RINGTRAIN_WITH_CUDA
struct QkvCase {
  int64_t n, hq, hkv, d;
  bool norm;
};

// Splits qkv [n, (hq + 2 hkv) d] into per-kind [n, heads, d] arrays (double).
void split_heads(const std::vector<float>& qkv, const QkvCase& c, std::vector<double>& q, std::vector<double>& k,
                 std::vector<double>& v) {
  const int64_t heads = c.hq + 2 * c.hkv;
  q.resize(c.n * c.hq * c.d), k.resize(c.n * c.hkv * c.d), v.resize(c.n * c.hkv * c.d);
  for (int64_t t = 0; t < c.n; ++t)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t j = 0; j < c.d; ++j) {
        const double val = qkv[(t * heads + h) * c.d + j];
        if (h < c.hq)
          q[(t * c.hq + h) * c.d + j] = val;
        else if (h < c.hq + c.hkv)
          k[(t * c.hkv + h - c.hq) * c.d + j] = val;
        else
          v[(t * c.hkv + h - c.hq - c.hkv) * c.d + j] = val;
      }
}

// The inverse of split_heads.
std::vector<double> join_heads(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                               const QkvCase& c) {
  const int64_t heads = c.hq + 2 * c.hkv;
  std::vector<double> out(c.n * heads * c.d);
  for (int64_t t = 0; t < c.n; ++t)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t j = 0; j < c.d; ++j) {
        const double val = h < c.hq           ? q[(t * c.hq + h) * c.d + j]
                           : h < c.hq + c.hkv ? k[(t * c.hkv + h - c.hq) * c.d + j]
                                              : v[(t * c.hkv + h - c.hq - c.hkv) * c.d + j];
        out[(t * heads + h) * c.d + j] = val;
      }
  return out;
}

// The CPU forward of one kind of head: optional per-head RMSNorm, then RoPE; rstd rounded to fp32 as saved.
void reference_heads(std::vector<double>& x, std::vector<double>& rstd, const std::vector<double>& raw,
                     const std::vector<double>& norm_w, bool norm, const std::vector<int32_t>& positions,
                     const std::vector<float>& inv_freq, int64_t n, int64_t heads, int64_t d) {
  x = raw;
  if (norm) {
    rstd.resize(n * heads);
    model::rmsnorm_forward(x.data(), rstd.data(), raw.data(), norm_w.data(), n * heads, d, kEps);
  }
  model::rope_forward(x.data(), positions.data(), inv_freq, n, heads, d);
}

// The CPU backward of one kind of head: RoPE transposed, then the per-head RMSNorm's backward (dw added to dw);
// dw_mag collects sum |u x r| over the same terms for the bound.
std::vector<double> reference_heads_backward(const std::vector<float>& grad, const std::vector<double>& raw,
                                             const std::vector<double>& norm_w, const std::vector<double>& rstd,
                                             bool norm, std::vector<double>& dw, std::vector<double>& dw_mag,
                                             const std::vector<int32_t>& positions, const std::vector<float>& inv_freq,
                                             int64_t n, int64_t heads, int64_t d) {
  std::vector<double> u = to_double(grad);
  model::rope_backward(u.data(), positions.data(), inv_freq, n, heads, d);
  if (!norm) return u;
  std::vector<double> dx(u.size(), 0.0), scratch(u.size(), 0.0), abs_u(u.size()), abs_raw(raw.size());
  model::rmsnorm_backward(dx.data(), dw.data(), u.data(), raw.data(), norm_w.data(), rstd.data(), n * heads, d);
  for (size_t i = 0; i < u.size(); ++i) abs_u[i] = std::fabs(u[i]), abs_raw[i] = std::fabs(raw[i]);
  model::rmsnorm_backward(scratch.data(), dw_mag.data(), abs_u.data(), abs_raw.data(), norm_w.data(), rstd.data(),
                          n * heads, d);
  return dx;
}

std::vector<double> fp32_rounded(const std::vector<double>& v) {
  std::vector<double> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = static_cast<float>(v[i]);
  return r;
}

void check_qkv_split(const QkvCase& c) {
  std::mt19937_64 rng(testing::fresh_seed());
  TestStream stream;
  const int64_t width = (c.hq + 2 * c.hkv) * c.d;
  const std::vector<float> qkv = random_bf16_values(c.n * width, rng);
  const std::vector<float> q_norm = random_bf16_values(c.d, rng, 0.2, 1.0),
                           k_norm = random_bf16_values(c.d, rng, 0.2, 1.0);
  // Positions up to 128K (long-context angles), with the extremes and repeats.
  std::vector<int32_t> positions = random_ints(c.n, 0, 131071, rng);
  positions[0] = 0, positions[1] = 131071, positions[2] = positions[3];
  model::RopeConfig rope;
  rope.theta = 1e6;
  const std::vector<float> inv_freq = model::rope_inv_freq(rope, c.d);

  std::vector<double> q_raw, k_raw, v_raw, q_ref, k_ref, rstd_q, rstd_k;
  split_heads(qkv, c, q_raw, k_raw, v_raw);
  const std::vector<double> q_norm_d = to_double(q_norm), k_norm_d = to_double(k_norm);
  reference_heads(q_ref, rstd_q, q_raw, q_norm_d, c.norm, positions, inv_freq, c.n, c.hq, c.d);
  reference_heads(k_ref, rstd_k, k_raw, k_norm_d, c.norm, positions, inv_freq, c.n, c.hkv, c.d);
  rstd_q = fp32_rounded(rstd_q), rstd_k = fp32_rounded(rstd_k);

  const std::vector<float> dq = random_bf16_values(c.n * c.hq * c.d, rng);
  const std::vector<float> dk = random_bf16_values(c.n * c.hkv * c.d, rng),
                           dv = random_bf16_values(c.n * c.hkv * c.d, rng);
  const std::vector<float> dq_norm0 = random_f32_values(c.d, rng), dk_norm0 = random_f32_values(c.d, rng);
  std::vector<double> dwq_ref = to_double(dq_norm0), dwk_ref = to_double(dk_norm0);
  std::vector<double> dwq_mag = abs_of(dq_norm0), dwk_mag = abs_of(dk_norm0);
  const std::vector<double> dq_raw = reference_heads_backward(dq, q_raw, q_norm_d, rstd_q, c.norm, dwq_ref, dwq_mag,
                                                              positions, inv_freq, c.n, c.hq, c.d);
  const std::vector<double> dk_raw = reference_heads_backward(dk, k_raw, k_norm_d, rstd_k, c.norm, dwk_ref, dwk_mag,
                                                              positions, inv_freq, c.n, c.hkv, c.d);
  const std::vector<double> dqkv_ref = join_heads(dq_raw, dk_raw, to_double(dv), c);

  auto d_qkv = upload_bf16(qkv), d_q_norm = upload_bf16(q_norm), d_k_norm = upload_bf16(k_norm);
  auto d_positions = upload(positions);
  auto d_inv_freq = upload(inv_freq);
  DeviceArray<bf16> d_q(c.n * c.hq * c.d), d_k(c.n * c.hkv * c.d), d_v(c.n * c.hkv * c.d), d_dqkv(c.n * width);
  DeviceArray<float> d_rstd_q(c.n * c.hq), d_rstd_k(c.n * c.hkv);
  d_q.poison(), d_k.poison(), d_v.poison(), d_dqkv.poison(), d_rstd_q.poison(), d_rstd_k.poison();
  auto d_dq = upload_bf16(dq), d_dk = upload_bf16(dk), d_dv = upload_bf16(dv);
  const std::vector<float> rstd_q_f(rstd_q.begin(), rstd_q.end()), rstd_k_f(rstd_k.begin(), rstd_k.end());
  auto d_rstd_q_in = upload(rstd_q_f), d_rstd_k_in = upload(rstd_k_f);
  auto d_dq_norm = upload(dq_norm0), d_dk_norm = upload(dk_norm0);

  const mc::QkvShape sh{c.n, c.hq, c.hkv, c.d, kEps};
  const bf16* qn = c.norm ? d_q_norm->get() : nullptr;
  const bf16* kn = c.norm ? d_k_norm->get() : nullptr;
  mc::qkv_split_forward(stream.get(), sh, d_q.get(), d_k.get(), d_v.get(), c.norm ? d_rstd_q.get() : nullptr,
                        c.norm ? d_rstd_k.get() : nullptr, d_qkv->get(), qn, kn, d_positions->get(), d_inv_freq->get());
  mc::qkv_split_backward(stream.get(), sh, d_dqkv.get(), c.norm ? d_dq_norm->get() : nullptr,
                         c.norm ? d_dk_norm->get() : nullptr, d_dq->get(), d_dk->get(), d_dv->get(), d_qkv->get(), qn,
                         kn, c.norm ? d_rstd_q_in->get() : nullptr, c.norm ? d_rstd_k_in->get() : nullptr,
                         d_positions->get(), d_inv_freq->get());
  stream.sync();

  // q/k: a c - b s cancels; fp32 terms of magnitude <= ~5 (normed heads times weights) err by ~1e-6 each.
  expect_elementwise("qkv_split q", download(d_q), q_ref, bf16_bound(q_ref, 1e-5));
  expect_elementwise("qkv_split k", download(d_k), k_ref, bf16_bound(k_ref, 1e-5));
  expect_elementwise("qkv_split v (a copy)", download(d_v), v_raw, [](size_t) { return 0.0; });
  // dqkv: the head norm's backward cancels like RMSNorm's (a d-term fp32 dot); v's part is a copy, bounded the same.
  expect_elementwise("qkv_split dqkv", download(d_dqkv), dqkv_ref, bf16_bound(dqkv_ref, 1e-4));
  if (c.norm) {
    expect_elementwise("qkv_split rstd_q", download(d_rstd_q), rstd_q,
                       [&](size_t i) { return fp32_sum_bound(c.d / 32.0 + 8, rstd_q[i]); });
    expect_elementwise("qkv_split rstd_k", download(d_rstd_k), rstd_k,
                       [&](size_t i) { return fp32_sum_bound(c.d / 32.0 + 8, rstd_k[i]); });
    // Shared-memory atomics over a block's tokens and heads, then one global atomic per block.
    expect_elementwise("qkv_split dq_norm", download(*d_dq_norm), dwq_ref,
                       [&](size_t i) { return fp32_sum_bound(2.0 * c.n * c.hq, 2 * dwq_mag[i]); });
    expect_elementwise("qkv_split dk_norm", download(*d_dk_norm), dwk_ref,
                       [&](size_t i) { return fp32_sum_bound(2.0 * c.n * c.hkv, 2 * dwk_mag[i]); });
  }
}

#endif  // RINGTRAIN_WITH_CUDA

TEST(GpuLayerKernels, QkvSplitHeadNormGqa4x2Dim64) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_qkv_split({333, 4, 2, 64, true}));
}
TEST(GpuLayerKernels, QkvSplitNoNormGqa8x2Dim128) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_qkv_split({333, 8, 2, 128, false}));
}
TEST(GpuLayerKernels, QkvSplitHeadNormMqa8x1Dim128) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_qkv_split({257, 8, 1, 128, true}));
}
// head_dim 34: the halves have an odd length (17), so the kernel takes single values instead of pairs.
TEST(GpuLayerKernels, QkvSplitOddHalfDim34) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_qkv_split({100, 3, 1, 34, true}));
}
// The model's shape (32 / 8 heads of 64): 16-byte packs without norms.
TEST(GpuLayerKernels, QkvSplitNoNormGqa32x8Dim64) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_qkv_split({515, 32, 8, 64, false}));
}
// head_dim 36 without norms: halves of 18, pairs but not packs of 8.
TEST(GpuLayerKernels, QkvSplitNoNormDim36) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_qkv_split({100, 3, 1, 36, false}));
}
// head_dim 34 without norms: single values.
TEST(GpuLayerKernels, QkvSplitNoNormOddHalfDim34) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_qkv_split({100, 3, 1, 34, false}));
}
TEST(GpuLayerKernels, QkvSplitNoNormDim256) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_qkv_split({65, 2, 2, 256, false}));
}

#ifdef RINGTRAIN_WITH_CUDA
void check_swiglu(int64_t n, int64_t ffn) {
  std::mt19937_64 rng(testing::fresh_seed());
  TestStream stream;
  const std::vector<float> gate_up = random_bf16_values(n * 2 * ffn, rng, 2.0), dh = random_bf16_values(n * ffn, rng);
  std::vector<double> gate(n * ffn), up(n * ffn);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < ffn; ++j)
      gate[r * ffn + j] = gate_up[r * 2 * ffn + j], up[r * ffn + j] = gate_up[r * 2 * ffn + ffn + j];
  const std::vector<double> dh_d = to_double(dh);
  std::vector<double> h_ref(n * ffn), dgate(n * ffn), dup(n * ffn), dgate_up_ref(n * 2 * ffn);
  model::swiglu_forward(h_ref.data(), gate.data(), up.data(), n * ffn);
  model::swiglu_backward(dgate.data(), dup.data(), dh_d.data(), gate.data(), up.data(), n * ffn);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < ffn; ++j)
      dgate_up_ref[r * 2 * ffn + j] = dgate[r * ffn + j], dgate_up_ref[r * 2 * ffn + ffn + j] = dup[r * ffn + j];

  auto d_gate_up = upload_bf16(gate_up), d_dh = upload_bf16(dh);
  DeviceArray<bf16> d_h(n * ffn), d_dgate_up(n * 2 * ffn);
  d_h.poison(), d_dgate_up.poison();
  mc::swiglu_forward(stream.get(), d_h.get(), d_gate_up->get(), n, ffn);
  mc::swiglu_backward(stream.get(), d_dgate_up.get(), d_dh->get(), d_gate_up->get(), n, ffn);
  stream.sync();
  // silu in fp32 (expf within 2 ulp): a few 2^-24 relative before the bf16 rounding; dgate's factor
  // 1 + g (1 - sig) can cancel, leaving ~1e-6 absolute error on terms of magnitude ~10.
  expect_elementwise("swiglu h", download(d_h), h_ref, bf16_bound(h_ref, 1e-6));
  expect_elementwise("swiglu dgate_up", download(d_dgate_up), dgate_up_ref, bf16_bound(dgate_up_ref, 1e-5));
}

#endif  // RINGTRAIN_WITH_CUDA

TEST(GpuLayerKernels, SwigluFfn64) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_swiglu(1000, 64));
}
TEST(GpuLayerKernels, SwigluFfn2048) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_swiglu(333, 2048));
}
TEST(GpuLayerKernels, SwigluOddFfn) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_swiglu(257, 13));
}

#ifdef RINGTRAIN_WITH_CUDA
// Logits N(0, 3^2); every fifth row has no target (-1).
void check_logprob_rows(int64_t rows, int64_t vocab) {
  std::mt19937_64 rng(testing::fresh_seed());
  TestStream stream;
  const std::vector<float> logits = random_f32_values(rows * vocab, rng, 3.0), d_logprob = random_f32_values(rows, rng);
  std::vector<int32_t> targets = random_ints(rows, 0, static_cast<int32_t>(vocab - 1), rng);
  for (int64_t r = 0; r < rows; r += 5) targets[r] = -1;
  targets[1] = static_cast<int32_t>(vocab - 1);

  std::vector<double> lse_ref(rows), logprob_ref(rows), entropy_ref(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const float* z = logits.data() + r * vocab;
    double mx = z[0], s = 0;
    for (int64_t j = 0; j < vocab; ++j) mx = std::max<double>(mx, z[j]);
    for (int64_t j = 0; j < vocab; ++j) s += std::exp(z[j] - mx);
    lse_ref[r] = mx + std::log(s);
    logprob_ref[r] = targets[r] < 0 ? 0.0 : z[targets[r]] - lse_ref[r];
    for (int64_t j = 0; j < vocab; ++j) entropy_ref[r] -= std::exp(z[j] - lse_ref[r]) * (z[j] - lse_ref[r]);
  }
  // The backward gets the reference lse rounded to fp32, the same value on both sides.
  const std::vector<float> lse_f(lse_ref.begin(), lse_ref.end());
  std::vector<double> dlogits_ref(rows * vocab, 0.0), g_abs(rows * vocab, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] < 0) continue;
    for (int64_t j = 0; j < vocab; ++j) {
      const double p = std::exp(static_cast<double>(logits[r * vocab + j]) - lse_f[r]);
      dlogits_ref[r * vocab + j] = d_logprob[r] * ((j == targets[r] ? 1.0 : 0.0) - p);
      g_abs[r * vocab + j] = std::fabs(d_logprob[r]);
    }
  }

  auto d_logits = upload(logits), d_dlp = upload(d_logprob), d_lse_in = upload(lse_f);
  auto d_targets = upload(targets);
  DeviceArray<float> d_out(rows), d_lse(rows), d_entropy(rows), d_out_plain(rows);
  d_out.poison(), d_lse.poison(), d_entropy.poison(), d_out_plain.poison();
  // Without entropy (the other instantiation of the kernel) and with it.
  mc::logprob_rows(stream.get(), d_out_plain.get(), d_lse.get(), d_logits->get(), d_targets->get(), rows, vocab);
  mc::logprob_rows(stream.get(), d_out.get(), d_lse.get(), d_logits->get(), d_targets->get(), rows, vocab,
                   d_entropy.get());
  // In place: the gradient is written over the logits just read, row r in the first half of row r's bytes.
  const bf16* dlogits_at = mc::logprob_rows_backward_in_place(stream.get(), d_logits->get(), d_lse_in->get(),
                                                              d_targets->get(), d_dlp->get(), rows, vocab);
  stream.sync();
  ASSERT_EQ(static_cast<const void*>(dlogits_at), static_cast<const void*>(d_logits->get()));
  std::vector<uint16_t> bits(rows * 2 * vocab);
  cuda_ok(cudaMemcpy(bits.data(), d_logits->get(), bits.size() * 2, cudaMemcpyDeviceToHost), "dlogits download");
  std::vector<float> dlogits(rows * vocab);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < vocab; ++j) dlogits[r * vocab + j] = bf16_to_float(bits[r * 2 * vocab + j]);

  // lse: the fp32 sum of exp(z - max) (each term within 2 ulp) along a thread's vocab/512 values, rescaled at each
  // step, then 9 merge levels: relative error <= 4 (vocab/512 + 10) 2^-24, which is lse's absolute error; plus logf
  // and the final max + log at |lse| < 32 (64 2^-24). logprob = z_t - lse adds one more rounding of that size.
  const double lse_bound = (4 * (vocab / 512.0 + 10) + 64) * std::ldexp(1.0, -24);
  expect_elementwise("logprob_rows lse", download(d_lse), lse_ref, [&](size_t) { return lse_bound; });
  expect_elementwise("logprob_rows logprob", download(d_out), logprob_ref,
                     [&](size_t r) { return targets[r] < 0 ? 0.0 : 2 * lse_bound; });
  expect_elementwise("logprob_rows logprob without entropy", download(d_out_plain), logprob_ref,
                     [&](size_t r) { return targets[r] < 0 ? 0.0 : 2 * lse_bound; });
  // entropy = log(sum) - sum e (z - max) / sum: both sums add terms of one sign (no cancellation), each as accurate
  // as lse's sum, so the entropy is within a few lse bounds relative to its size (<= log(vocab) < 12).
  expect_elementwise("logprob_rows entropy", download(d_entropy), entropy_ref,
                     [&](size_t r) { return 4 * lse_bound * (1 + entropy_ref[r]); });
  // dlogits: p = expf(z - lse) within ~2e-6 relative (|z - lse| <= ~30 rounded in fp32), then one bf16 rounding;
  // rows without a target are exact zeros.
  expect_elementwise("logprob_rows_backward_in_place dlogits", dlogits, dlogits_ref,
                     [&](size_t i) { return kBf16Out * std::fabs(dlogits_ref[i]) + 1e-6 * g_abs[i]; });
}

#endif  // RINGTRAIN_WITH_CUDA

TEST(GpuLayerKernels, LogprobRowsQwenVocab) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_logprob_rows(37, 151936));
}
TEST(GpuLayerKernels, LogprobRowsLlama3Vocab) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_logprob_rows(6, 128256));
}
TEST(GpuLayerKernels, LogprobRowsOddVocab) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_logprob_rows(64, 1001));
}

}  // namespace
}  // namespace ringtrain
