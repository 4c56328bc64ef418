// Gemm::batched_f32 (core/cuda/gemm.h), the GPU math attention backend's products, against fp64 loops on the same
// fp32 inputs: transposed and plain operands, padded row pitches and batch strides, every entry; and a hand-computed
// case that only true fp32 gets right (TF32 would drop the 2^-12 of every product).
//
// Bound per entry, mag = |alpha| * sum |products|: any order of summing k fp32 products (each rounded once) and one
// rounding for alpha stays within (k + 2) 2^-24 mag. TF32 operands (10-bit mantissas) would err by about
// 2^-11 mag / sqrt(k), 20x more at k = 64.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "test_util.h"
#ifdef RINGTRAIN_WITH_CUDA
#include "ringtrain/core/cuda/gemm.h"
#endif

namespace ringtrain {
namespace {

#ifdef RINGTRAIN_WITH_CUDA
using ringtrain::cuda::Gemm;
using ringtrain::cuda::RowMajorF32;

// A host array uploaded to the GPU.
Tensor upload(const std::vector<float>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::F32, Device::cuda(0));
  copy(t, contiguous_view(const_cast<float*>(v.data()), DType::F32, Device::cpu(), {static_cast<int64_t>(v.size())}));
  return t;
}

std::vector<float> download(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  copy(contiguous_view(v.data(), DType::F32, Device::cpu(), {t.numel()}), t);
  return v;
}

void check_batched(bool trans_a, bool trans_b) {
  const int64_t m = 37, n = 45, k = 64, batch = 3;
  // Stored shapes: A [m, k] or [k, m], B [k, n] or [n, k]; rows padded, batch entries apart by more than a matrix.
  const int64_t a_rows = trans_a ? k : m, a_cols = trans_a ? m : k, lda = a_cols + 3, sa = a_rows * lda + 11;
  const int64_t b_rows = trans_b ? n : k, b_cols = trans_b ? k : n, ldb = b_cols + 5, sb = b_rows * ldb + 7;
  const int64_t ldc = n + 4, sc = m * ldc + 9;
  std::mt19937_64 rng(testing::fresh_seed());
  std::normal_distribution<float> dist;
  std::vector<float> a(static_cast<size_t>(batch * sa)), b(static_cast<size_t>(batch * sb));
  for (float& x : a) x = dist(rng);
  for (float& x : b) x = dist(rng);
  const float alpha = 0.7f;

  Tensor da = upload(a), db = upload(b);
  Tensor dc = upload(std::vector<float>(static_cast<size_t>(batch * sc), std::numeric_limits<float>::quiet_NaN()));
  Gemm gemm(nullptr);
  gemm.batched_f32(m, n, k, alpha, RowMajorF32{da.ptr<float>(), lda, sa, trans_a},
                   RowMajorF32{db.ptr<float>(), ldb, sb, trans_b}, dc.ptr<float>(), ldc, sc, batch);
  const std::vector<float> c = download(dc);  // the blocking copy waits for the legacy stream

  for (int64_t e = 0; e < batch; ++e) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < ldc; ++j) {
        const float got = c[static_cast<size_t>(e * sc + i * ldc + j)];
        if (j >= n) {  // the row padding is not part of C
          EXPECT_TRUE(std::isnan(got)) << "padding written at batch " << e << " row " << i << " column " << j;
          continue;
        }
        double ref = 0, mag = 0;
        for (int64_t kk = 0; kk < k; ++kk) {
          const double x = a[static_cast<size_t>(e * sa + (trans_a ? kk * lda + i : i * lda + kk))];
          const double y = b[static_cast<size_t>(e * sb + (trans_b ? j * ldb + kk : kk * ldb + j))];
          ref += x * y;
          mag += std::fabs(x * y);
        }
        ref *= alpha, mag *= std::fabs(alpha);
        const double bound = static_cast<double>(k + 2) * std::ldexp(1.0, -24) * mag;
        ASSERT_LE(std::fabs(got - ref), bound) << "batch " << e << " C[" << i << ", " << j << "] = " << got
                                               << ", fp64 " << ref << " (trans_a " << trans_a << ", trans_b "
                                               << trans_b << ")";
      }
    }
  }
}

TEST(GemmF32, BatchedTransposedBMatchesFp64) {
  RT_REQUIRE_GPU();
  check_batched(false, true);  // S = Q K^T
}

TEST(GemmF32, BatchedTransposedAMatchesFp64) {
  RT_REQUIRE_GPU();
  check_batched(true, false);  // dV = P^T dO
}

// A = 1 + 2^-12 (exact in fp32, 1 in TF32), B = 1, k = 4: every partial sum is exact in fp32, so C = 4 + 2^-10
// exactly; TF32 operands would give 4.
TEST(GemmF32, IsTrueFp32NotTf32) {
  RT_REQUIRE_GPU();
  const int64_t m = 8, n = 8, k = 4;
  const float one_plus = 1.f + std::ldexp(1.f, -12);
  Tensor da = upload(std::vector<float>(m * k, one_plus)), db = upload(std::vector<float>(k * n, 1.f));
  Tensor dc = upload(std::vector<float>(m * n, std::numeric_limits<float>::quiet_NaN()));
  Gemm gemm(nullptr);
  gemm.batched_f32(m, n, k, 1.f, RowMajorF32{da.ptr<float>(), k, m * k, false},
                   RowMajorF32{db.ptr<float>(), n, k * n, false}, dc.ptr<float>(), n, m * n, 1);
  for (float x : download(dc)) ASSERT_EQ(x, 4.f + std::ldexp(1.f, -10));
}
#endif  // RINGTRAIN_WITH_CUDA

}  // namespace
}  // namespace ringtrain
