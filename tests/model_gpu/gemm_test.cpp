// The cuBLASLt products of the GPU model (core/cuda/gemm.h) against double loops on the same bf16 inputs: every
// entry for small shapes; for the model's big shapes (n = 1000 x 2048 -> 8192, an LM-head chunk 512 x 2048 -> 151936,
// a 131072-token sequence) the corners and random entries of forward results, and whole sampled rows (first, last,
// 6 random) of dx and dw. Fresh random inputs, results poisoned with NaN unless the product accumulates into them.
//
// Bounds per entry, mag = sum |products| (+ |initial value| when accumulating):
//  - fp32 accumulation: bf16 products are exact in fp32; cuBLASLt sums 16-wide tensor-core steps, so a chain of
//    about k/16 fp32 additions plus split-K merges (k/16 + 32 here), doubled for the tensor cores' truncating
//    alignment: 2 (k/16 + 34) 2^-24 mag. (A bf16-rounded accumulator or result would break this by ~100x.)
//  - bf16 results add one rounding: 2^-8 |ref| (unit roundoff 2^-9 plus room).
//  - db: the column-sum kernel's fp32 chain of at most 2n additions: (2n + 2) 2^-24 mag.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "kernel_test_util.h"
#include "test_util.h"
#ifdef RINGTRAIN_WITH_CUDA
#include "ringtrain/core/cuda/gemm.h"
#endif

namespace ringtrain {
namespace {

#ifdef RINGTRAIN_WITH_CUDA
using namespace testing::kernels;
using ringtrain::cuda::Gemm;

// Uniform(-1, 1) values rounded to bf16: cheap to draw for the LM head's 311M weights.
std::vector<float> uniform_bf16_values(size_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = bf16_to_float(float_to_bf16(dist(rng)));
  return v;
}

double accumulation_bound(int64_t k, double magnitude) { return 2 * fp32_sum_bound(k / 16.0 + 32, magnitude); }

// Entries of a [rows, cols] result to check: all of them when the reference is cheap, else the corners and `count`
// random ones.
std::vector<std::pair<int64_t, int64_t>> entries(int64_t rows, int64_t cols, int64_t k, size_t count,
                                                 std::mt19937_64& rng) {
  std::vector<std::pair<int64_t, int64_t>> e;
  if (rows * cols * k <= (int64_t{1} << 27)) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) e.emplace_back(r, c);
    return e;
  }
  e = {{0, 0}, {0, cols - 1}, {rows - 1, 0}, {rows - 1, cols - 1}};
  std::uniform_int_distribution<int64_t> row(0, rows - 1), col(0, cols - 1);
  for (size_t i = 0; i < count; ++i) e.emplace_back(row(rng), col(rng));
  return e;
}

// A row-major host matrix [rows, cols] seen through (r, c).
struct Mat {
  const float* p;
  int64_t cols;
  double at(int64_t r, int64_t c) const { return p[r * cols + c]; }
};

// One product entry: value and sum of |terms| over k of a(i, t) * b(t, j).
template <typename A, typename B>
std::pair<double, double> dot(int64_t k, A&& a, B&& b) {
  double s = 0, mag = 0;
  for (int64_t t = 0; t < k; ++t) {
    const double p = a(t) * b(t);
    s += p, mag += std::fabs(p);
  }
  return {s, mag};
}

// Compares a downloaded [rows, cols] result with ref(r, c) -> (value, magnitude) at the given entries, within
// bound(value, magnitude, r, c).
template <typename Ref, typename Bound>
void check_entries(const std::string& what, const std::vector<float>& got, int64_t cols,
                   const std::vector<std::pair<int64_t, int64_t>>& at, Ref&& ref, Bound&& bound) {
  std::vector<float> got_at(at.size());
  std::vector<double> ref_at(at.size()), mag_at(at.size());
  for (size_t i = 0; i < at.size(); ++i) {
    got_at[i] = got[at[i].first * cols + at[i].second];
    std::tie(ref_at[i], mag_at[i]) = ref(at[i].first, at[i].second);
  }
  expect_elementwise(what, got_at, ref_at,
                     [&](size_t i) { return bound(ref_at[i], mag_at[i], at[i].first, at[i].second); });
}

struct Shape {
  int64_t n, in, out;
};

// How the forward's result starts: from nothing, from a separate residual, or from the residual already in y.
enum class Residual { None, Separate, InPlace };

// y = x w^T (+ bias) (+ residual) in bf16, twice on the same shape with other inputs and another bias: the cached
// plan must take the new pointers (the second bias is misaligned on purpose when `misaligned_second_bias`).
void check_forward(const Shape& s, bool bias, bool misaligned_second_bias, size_t samples,
                   Residual residual = Residual::None) {
  std::mt19937_64 rng(testing::fresh_seed());
  TestStream stream;
  Gemm gemm(stream.get());
  for (int call = 0; call < 2; ++call) {
    const std::vector<float> x = uniform_bf16_values(s.n * s.in, rng), w = uniform_bf16_values(s.out * s.in, rng);
    const std::vector<float> b = uniform_bf16_values(s.out, rng), res = uniform_bf16_values(s.n * s.out, rng);
    auto d_x = upload_bf16(x), d_w = upload_bf16(w);
    const size_t bias_offset = (call == 1 && misaligned_second_bias) ? 1 : 0;
    DeviceArray<bf16> d_b(s.out + 1);
    upload_to(d_b, b, bias_offset);
    DeviceArray<bf16> d_y(s.n * s.out), d_res(s.n * s.out);
    d_y.poison();
    if (residual == Residual::Separate) upload_to(d_res, res, 0);
    if (residual == Residual::InPlace) upload_to(d_y, res, 0);
    const bf16* res_ptr = residual == Residual::None       ? nullptr
                          : residual == Residual::Separate ? d_res.get()
                                                           : d_y.get();
    gemm.linear_forward(d_y.get(), d_x->get(), d_w->get(), bias ? d_b.get() + bias_offset : nullptr, s.n, s.in, s.out,
                        res_ptr);
    stream.sync();
    const Mat xm{x.data(), s.in}, wm{w.data(), s.in};
    check_entries(
        cat("linear_forward ", s.n, "x", s.in, "->", s.out, bias ? " +bias" : "",
            residual == Residual::None ? "" : residual == Residual::Separate ? " +residual" : " +residual in place",
            " call ", call + 1, bias_offset ? " (misaligned bias)" : ""),
        download(d_y), s.out, entries(s.n, s.out, s.in, samples, rng),
        [&](int64_t r, int64_t c) {
          auto [v, mag] = dot(
              s.in, [&](int64_t t) { return xm.at(r, t); }, [&](int64_t t) { return wm.at(c, t); });
          const double extra = (bias ? b[c] : 0.0) + (residual == Residual::None ? 0.0 : res[r * s.out + c]);
          const double extra_mag = (bias ? std::fabs(b[c]) : 0.0) +
                                   (residual == Residual::None ? 0.0 : std::fabs(res[r * s.out + c]));
          return std::pair{v + extra, mag + extra_mag};
        },
        [&](double ref, double mag, int64_t r, int64_t c) {
          // Like the accumulated dx below, the epilogue may round the product to bf16 before adding the residual.
          const double product = ref - (residual == Residual::None ? 0.0 : res[r * s.out + c]);
          return kBf16Out * (std::fabs(ref) + (residual == Residual::None ? 0.0 : std::fabs(product))) +
                 accumulation_bound(s.in, mag);
        });
  }
}

// Rows `rows` of C = A B for a row-major B [k, cols] and A(r, t) given, streaming through B's rows: the values
// and the sums of |terms| (plus |init(r, c)|, the value C starts from), row after row.
template <typename A, typename Init>
void reference_rows(const std::vector<int64_t>& rows, int64_t k, const std::vector<float>& b, int64_t cols, A&& a,
                    Init&& init, std::vector<double>& value, std::vector<double>& mag) {
  value.assign(rows.size() * cols, 0.0), mag.assign(rows.size() * cols, 0.0);
  for (size_t i = 0; i < rows.size(); ++i) {
    double *v = value.data() + i * cols, *m = mag.data() + i * cols;
    for (int64_t c = 0; c < cols; ++c) v[c] = init(rows[i], c), m[c] = std::fabs(v[c]);
    for (int64_t t = 0; t < k; ++t) {
      const double coef = a(rows[i], t);
      const float* bt = b.data() + t * cols;
      for (int64_t c = 0; c < cols; ++c) v[c] += coef * bt[c], m[c] += std::fabs(coef * bt[c]);
    }
  }
}

// Every row when the reference is cheap, else the first, the last and 6 random ones.
std::vector<int64_t> pick_rows(int64_t rows, int64_t cost_per_row, std::mt19937_64& rng) {
  std::vector<int64_t> r;
  if (rows * cost_per_row <= (int64_t{1} << 28)) {
    for (int64_t i = 0; i < rows; ++i) r.push_back(i);
    return r;
  }
  r = {0, rows - 1};
  std::uniform_int_distribution<int64_t> any(0, rows - 1);
  for (int i = 0; i < 6; ++i) r.push_back(any(rng));
  return r;
}

// got's entries in the given rows, in reference_rows' order.
std::vector<float> gather_rows(const std::vector<float>& got, const std::vector<int64_t>& rows, int64_t cols) {
  std::vector<float> out;
  for (int64_t r : rows) out.insert(out.end(), got.begin() + r * cols, got.begin() + (r + 1) * cols);
  return out;
}

// dx = (accumulate ? dx0 : 0) + dy w, dw = (overwrite_dw ? 0 : dw0) + dy^T x (fp32), db = db0 + column sums of dy
// (fp32), checked on whole rows. An overwritten dw starts poisoned: the first contribution of a step writes it.
// dy_ld > out: dy's rows lie dy_ld elements apart (the LM head's gradient inside its logits' buffer), with large
// values between them that must not be read.
void check_backward(const Shape& s, bool with_dx, bool accumulate, bool with_db, bool overwrite_dw,
                    int64_t dy_ld = 0) {
  if (dy_ld == 0) dy_ld = s.out;
  std::mt19937_64 rng(testing::fresh_seed());
  TestStream stream;
  Gemm gemm(stream.get());
  const std::vector<float> x = uniform_bf16_values(s.n * s.in, rng), w = uniform_bf16_values(s.out * s.in, rng);
  const std::vector<float> dy = uniform_bf16_values(s.n * s.out, rng), dx0 = uniform_bf16_values(s.n * s.in, rng);
  const std::vector<float> db0 = random_f32_values(s.out, rng);
  const std::vector<float> dw0 = overwrite_dw ? std::vector<float>() : random_f32_values(s.out * s.in, rng);
  std::vector<float> dy_rows(s.n * dy_ld, 1e4f);
  for (int64_t r = 0; r < s.n; ++r) std::copy_n(dy.begin() + r * s.out, s.out, dy_rows.begin() + r * dy_ld);
  auto d_x = upload_bf16(x), d_w = upload_bf16(w), d_dy = upload_bf16(dy_rows), d_dx = upload_bf16(dx0);
  auto d_db = upload(db0);
  DeviceArray<float> d_dw(s.out * s.in);
  if (overwrite_dw) {
    d_dw.poison();
  } else {
    upload_to(d_dw, dw0);
  }
  if (!accumulate) d_dx->poison();
  gemm.linear_backward(with_dx ? d_dx->get() : nullptr, accumulate, d_dw.get(), !overwrite_dw,
                       with_db ? d_db->get() : nullptr, d_dy->get(), d_x->get(), d_w->get(), s.n, s.in, s.out, dy_ld);
  stream.sync();

  const std::string shape = cat(s.n, "x", s.in, "->", s.out, dy_ld != s.out ? cat(" (dy pitch ", dy_ld, ")") : "");
  std::vector<double> ref, mag;
  if (with_dx) {
    const std::vector<int64_t> rows = pick_rows(s.n, s.out * s.in, rng);
    reference_rows(
        rows, s.out, w, s.in, [&](int64_t r, int64_t t) { return double(dy[r * s.out + t]); },
        [&](int64_t r, int64_t c) { return accumulate ? double(dx0[r * s.in + c]) : 0.0; }, ref, mag);
    expect_elementwise(cat("linear_backward dx ", shape, accumulate ? " accumulated" : " overwritten"),
                       gather_rows(download(*d_dx), rows, s.in), ref,
                       [&](size_t i) {
                         // cuBLASLt rounds the product to bf16 before adding the old dx in its epilogue: one more
                         // rounding, of the product alone.
                         const double old = accumulate ? double(dx0[rows[i / s.in] * s.in + i % s.in]) : 0.0;
                         return kBf16Out * (std::fabs(ref[i]) + std::fabs(ref[i] - old)) +
                                accumulation_bound(s.out, mag[i]);
                       });
  }
  const std::vector<int64_t> dw_rows = pick_rows(s.out, s.n * s.in, rng);
  reference_rows(
      dw_rows, s.n, x, s.in, [&](int64_t o, int64_t t) { return double(dy[t * s.out + o]); },
      [&](int64_t o, int64_t c) { return overwrite_dw ? 0.0 : double(dw0[o * s.in + c]); }, ref, mag);
  expect_elementwise(cat("linear_backward dw ", shape, overwrite_dw ? " overwritten" : " accumulated"),
                     gather_rows(download(d_dw), dw_rows, s.in), ref,
                     [&](size_t i) { return accumulation_bound(s.n, mag[i]); });
  if (!with_db) return;
  const std::vector<float> db = download(*d_db);
  reference_rows(
      {0}, s.n, dy, s.out, [](int64_t, int64_t) { return 1.0; }, [&](int64_t, int64_t c) { return double(db0[c]); },
      ref, mag);
  expect_elementwise(cat("linear_backward db ", shape), db, ref,
                     [&](size_t i) { return fp32_sum_bound(2.0 * s.n, mag[i]); });
}

// The LM head's logits in fp32: y[512, 151936] = x[512, 2048] w^T, no bf16 rounding at the end.
void check_forward_f32(const Shape& s, size_t samples) {
  std::mt19937_64 rng(testing::fresh_seed());
  TestStream stream;
  Gemm gemm(stream.get());
  const std::vector<float> x = uniform_bf16_values(s.n * s.in, rng), w = uniform_bf16_values(s.out * s.in, rng);
  auto d_x = upload_bf16(x), d_w = upload_bf16(w);
  DeviceArray<float> d_y(s.n * s.out);
  d_y.poison();
  gemm.linear_forward_f32(d_y.get(), d_x->get(), d_w->get(), s.n, s.in, s.out);
  stream.sync();
  const Mat xm{x.data(), s.in}, wm{w.data(), s.in};
  check_entries(
      cat("linear_forward_f32 ", s.n, "x", s.in, "->", s.out), download(d_y), s.out,
      entries(s.n, s.out, s.in, samples, rng),
      [&](int64_t r, int64_t c) {
        return dot(
            s.in, [&](int64_t t) { return xm.at(r, t); }, [&](int64_t t) { return wm.at(c, t); });
      },
      [&](double ref, double mag, int64_t, int64_t) {
        return std::ldexp(std::fabs(ref), -24) + accumulation_bound(s.in, mag);
      });
}

#endif  // RINGTRAIN_WITH_CUDA

TEST(GpuGemm, ForwardSmallOddShapeEveryEntry) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_forward({37, 64, 96}, false, false, 0));
}
TEST(GpuGemm, ForwardBiasN1000In2048Out8192) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_forward({1000, 2048, 8192}, true, false, 4000));
}
TEST(GpuGemm, ForwardBiasNewPointerAndMisalignedBias) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_forward({129, 128, 200}, true, true, 0));
}
// The residual stream added by the product's C operand: y = x w^T + bias + r, and y += x w^T in place.
TEST(GpuGemm, ForwardBiasAndResidualOddShapeEveryEntry) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_forward({37, 64, 96}, true, false, 0, Residual::Separate));
}
TEST(GpuGemm, ForwardResidualInPlaceN1000In8192Out2048) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_forward({1000, 8192, 2048}, false, false, 4000, Residual::InPlace));
}
TEST(GpuGemm, ForwardSequenceOf131072Tokens) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_forward({131072, 256, 512}, false, false, 2000));
}
TEST(GpuGemm, ForwardF32SmallOddShapeEveryEntry) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_forward_f32({37, 64, 96}, 0));
}
// The LM head's logits for one chunk of tokens: [512, 2048] x [151936, 2048]^T.
TEST(GpuGemm, ForwardF32LmHeadChunk512x2048x151936) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_forward_f32({512, 2048, 151936}, 4000));
}

TEST(GpuGemm, BackwardSmallOddShapeOverwrite) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_backward({37, 64, 96}, true, false, true, false));
}
TEST(GpuGemm, BackwardSmallOddShapeAccumulate) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_backward({37, 64, 96}, true, true, true, false));
}
TEST(GpuGemm, BackwardN1000In2048Out8192Accumulate) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_backward({1000, 2048, 8192}, true, true, true, false));
}
TEST(GpuGemm, BackwardWeightsOnlyWithoutDxOrDb) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_backward({1000, 2048, 512}, false, false, false, false));
}
TEST(GpuGemm, BackwardOverwritesPoisonedDwN1000In2048Out8192) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_backward({1000, 2048, 8192}, true, true, true, true));
}
// The backward of one LM-head chunk: dlogits [512, 151936], rows 2 x 151936 apart as they lie over the chunk's fp32
// logits, into d_hidden and the head's fp32 gradient: the first chunk overwrites it, later ones add. The adding
// product's 1.2 GB result is too large for a scratch copy: its autotuning runs on the result itself with a zero
// operand, which must leave the result as it was.
TEST(GpuGemm, BackwardLmHeadFirstChunk512x2048x151936) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_backward({512, 2048, 151936}, true, false, false, true, 2 * 151936));
}
TEST(GpuGemm, BackwardLmHeadLaterChunk512x2048x151936) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_backward({512, 2048, 151936}, true, false, false, false, 2 * 151936));
}
// A weight gradient summed over 131072 tokens (K = 131072).
TEST(GpuGemm, BackwardSequenceOf131072Tokens) {
  RT_REQUIRE_GPU();
  RT_GPU_ONLY(check_backward({131072, 256, 512}, true, true, true, false));
}

}  // namespace
}  // namespace ringtrain
