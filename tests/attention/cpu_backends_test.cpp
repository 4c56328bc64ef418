// The CPU backends against each other and against an independent naive formula:
//  - flash (fp32 accumulation) vs math (fp64 accumulation) over masks, GQA/MQA, head dims, ragged lengths;
//  - math's forward vs a naive softmax written here;
//  - packed (THD) calls vs per-sequence dense calls; strided (BHSD) views vs contiguous BSHD;
//  - fully masked rows (LSE = -inf, O = 0, no gradient); accumulate mode.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <tuple>

#include "attention_test_util.h"
#include "ringtrain/attention/cpu/cpu_backends.h"

namespace ringtrain {
namespace {

using attention::MaskType;
using testing::AttnProblem;
using testing::AttnResult;
using testing::make_problem;
using testing::rel_error;
using testing::run_backend;

const attention::Backend& math() { return *attention::find_backend(attention::BackendId::Math, DeviceKind::CPU); }
const attention::Backend& flash() { return *attention::find_backend(attention::BackendId::Flash, DeviceKind::CPU); }

// fp32 accumulation over at most a few hundred keys of N(0,1) data stays far below 1e-5 relative error
// against fp64 (each dot product and softmax sum carries ~1e-7 relative rounding).
constexpr double kFp32Tol = 1e-5;

void expect_close(const AttnResult& a, const AttnResult& ref, double tol) {
  EXPECT_LE(rel_error(a.o, ref.o), tol) << "O";
  EXPECT_LE(rel_error(a.lse, ref.lse), tol) << "LSE";
  EXPECT_LE(rel_error(a.dq, ref.dq), tol) << "dQ";
  EXPECT_LE(rel_error(a.dk, ref.dk), tol) << "dK";
  EXPECT_LE(rel_error(a.dv, ref.dv), tol) << "dV";
}

// (mask, heads_q, heads_kv, head_dim, seqlen_q, seqlen_kv)
using Shape = std::tuple<MaskType, int, int, int, int, int>;
class FlashVsMath : public ::testing::TestWithParam<Shape> {};

TEST_P(FlashVsMath, Fp32MatchesFp64Reference) {
  auto [mask, hq, hkv, d, sq, skv] = GetParam();
  std::mt19937_64 rng(testing::fresh_seed());
  AttnProblem pr = make_problem(2, hq, hkv, d, sq, skv, mask, DType::F32, rng);
  AttnResult ref = run_backend(math(), pr, DType::F64);
  AttnResult got = run_backend(flash(), pr, DType::F32);
  expect_close(got, ref, kFp32Tol);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, FlashVsMath,
    ::testing::Values(Shape{MaskType::None, 4, 4, 32, 100, 100}, Shape{MaskType::CausalTopLeft, 4, 4, 64, 131, 131},
                      Shape{MaskType::CausalTopLeft, 8, 2, 128, 70, 70},   // GQA
                      Shape{MaskType::CausalTopLeft, 4, 1, 64, 97, 97},    // MQA
                      Shape{MaskType::None, 4, 2, 64, 33, 150},            // Sq < Skv
                      Shape{MaskType::CausalBottomRight, 4, 2, 32, 40, 150},
                      Shape{MaskType::CausalTopLeft, 4, 2, 32, 40, 150},
                      Shape{MaskType::CausalBottomRight, 2, 2, 64, 150, 40},  // first 110 rows see nothing
                      Shape{MaskType::CausalTopLeft, 2, 1, 32, 150, 40}));

// An independent forward: softmax(q k^T * scale) v per row, written out directly in fp64.
TEST(MathBackend, ForwardMatchesNaiveSoftmax) {
  std::mt19937_64 rng(testing::fresh_seed());
  AttnProblem pr = make_problem(1, 4, 2, 16, 23, 31, MaskType::CausalBottomRight, DType::F64, rng);
  AttnResult r = run_backend(math(), pr, DType::F64);
  const auto& p = pr.p;
  const double scale = 1.0 / std::sqrt(16.0);
  double worst = 0;
  for (int64_t h = 0; h < p.heads_q; ++h) {
    const int64_t kh = h / 2;
    for (int64_t i = 0; i < p.seqlen_q; ++i) {
      const int64_t visible = i + 1 + p.seqlen_kv - p.seqlen_q;
      std::vector<double> s(visible);
      double mx = -1e300, sum = 0;
      for (int64_t j = 0; j < visible; ++j) {
        double dot = 0;
        for (int64_t c = 0; c < 16; ++c)
          dot += *static_cast<double*>(pr.q.view().at({0, i, h, c})) * *static_cast<double*>(pr.k.view().at({0, j, kh, c}));
        s[j] = dot * scale;
        mx = std::max(mx, s[j]);
      }
      for (double& x : s) sum += (x = std::exp(x - mx));
      EXPECT_NEAR(*static_cast<float*>(r.lse.view().at({0, h, i})), mx + std::log(sum), 1e-5);
      for (int64_t c = 0; c < 16; ++c) {
        double o = 0;
        for (int64_t j = 0; j < visible; ++j) o += s[j] / sum * *static_cast<double*>(pr.v.view().at({0, j, kh, c}));
        worst = std::max(worst, std::fabs(o - *static_cast<double*>(r.o.view().at({0, i, h, c}))));
      }
    }
  }
  EXPECT_LE(worst, 1e-12);  // the same fp64 arithmetic in another order
}

// Rows that see no key: LSE = -inf, O = 0, and no gradient flows through them.
TEST(CpuBackends, FullyMaskedRowsFollowTheConvention) {
  std::mt19937_64 rng(testing::fresh_seed());
  // Bottom-right with Sq=12 > Skv=5: rows 0..6 see nothing.
  AttnProblem pr = make_problem(1, 2, 1, 8, 12, 5, MaskType::CausalBottomRight, DType::F32, rng);
  for (const attention::Backend* be : {&math(), &flash()}) {
    AttnResult r = run_backend(*be, pr, DType::F32);
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < 12; ++i) {
        const float lse = *static_cast<float*>(r.lse.view().at({0, h, i}));
        if (i < 7) {
          EXPECT_TRUE(std::isinf(lse) && lse < 0) << backend_name(be->id()) << " row " << i;
          for (int64_t c = 0; c < 8; ++c) {
            EXPECT_EQ(*static_cast<float*>(r.o.view().at({0, i, h, c})), 0.f);
            EXPECT_EQ(*static_cast<float*>(r.dq.view().at({0, i, h, c})), 0.f);
          }
        } else {
          EXPECT_TRUE(std::isfinite(lse));
        }
      }
  }
}

// Packed (THD) sequences of odd lengths equal separate dense calls per sequence.
TEST(CpuBackends, PackedMatchesPerSequenceDense) {
  std::mt19937_64 rng(testing::fresh_seed());
  const std::vector<int32_t> lens = {7, 1, 33, 20};
  const int64_t hq = 4, hkv = 2, d = 32;
  int32_t total = 0;
  for (int32_t l : lens) total += l;
  Tensor cu = Tensor::empty({static_cast<int64_t>(lens.size()) + 1}, DType::I32);
  cu.ptr<int32_t>()[0] = 0;
  for (size_t i = 0; i < lens.size(); ++i) cu.ptr<int32_t>()[i + 1] = cu.ptr<int32_t>()[i] + lens[i];
  Tensor q = Tensor::empty({total, hq, d}, DType::F32), k = Tensor::empty({total, hkv, d}, DType::F32),
         v = Tensor::empty({total, hkv, d}, DType::F32), dout = Tensor::empty({total, hq, d}, DType::F32);
  for (const Tensor* t : {&q, &k, &v, &dout}) testing::fill_normal(*t, rng);
  attention::AttnParams p;
  p.batch = static_cast<int64_t>(lens.size());
  p.heads_q = hq;
  p.heads_kv = hkv;
  p.head_dim = d;
  p.seqlen_q = p.seqlen_kv = 33;
  p.mask = MaskType::CausalTopLeft;
  p.packed = true;
  for (const attention::Backend* be : {&math(), &flash()}) {
    Tensor o = Tensor::empty({total, hq, d}, DType::F32), lse = Tensor::empty({hq, total}, DType::F32);
    Tensor dq = Tensor::empty({total, hq, d}, DType::F32), dk = Tensor::empty({total, hkv, d}, DType::F32),
           dv = Tensor::empty({total, hkv, d}, DType::F32);
    for (const Tensor* t : {&o, &lse, &dq, &dk, &dv}) testing::poison(*t);
    attention::AttnForwardArgs f{q, k, v, o, lse, cu, cu};
    attention::validate(p, f);
    be->forward(p, f);
    attention::AttnBackwardArgs b{q, k, v, o, dout, lse, dq, dk, dv, false, cu, cu};
    attention::validate(p, b);
    be->backward(p, b);
    int32_t start = 0;
    for (int32_t len : lens) {
      auto rows = [&](const Tensor& t) {  // [len, H, D] -> [1, len, H, D]
        TensorView v3 = t.view().slice(0, start, len);
        TensorView v4 = v3;
        v4.ndim = 4;
        v4.shape = {1, len, v3.shape[1], v3.shape[2]};
        v4.stride = {len * v3.stride[0], v3.stride[0], v3.stride[1], v3.stride[2]};
        return v4;
      };
      AttnProblem one;
      for (auto [dst, src] : {std::pair{&one.q, &q}, {&one.k, &k}, {&one.v, &v}, {&one.dout, &dout}}) {
        TensorView sv = rows(*src);
        *dst = Tensor::empty({1, len, sv.shape[2], d}, DType::F32);
        copy(*dst, sv);
      }
      one.p = attention::params_for(one.q, one.k, MaskType::CausalTopLeft);
      AttnResult ref = run_backend(math(), one, DType::F64);
      EXPECT_LE(rel_error(rows(o), ref.o), kFp32Tol) << backend_name(be->id()) << " len " << len;
      EXPECT_LE(rel_error(rows(dq), ref.dq), kFp32Tol) << backend_name(be->id()) << " len " << len;
      EXPECT_LE(rel_error(rows(dk), ref.dk), kFp32Tol) << backend_name(be->id()) << " len " << len;
      EXPECT_LE(rel_error(rows(dv), ref.dv), kFp32Tol) << backend_name(be->id()) << " len " << len;
      TensorView ref_lse = ref.lse.view();  // [1, H, len] -> [H, len]
      ref_lse.ndim = 2;
      ref_lse.shape = {hq, len};
      ref_lse.stride = {len, 1};
      EXPECT_LE(rel_error(lse.view().slice(1, start, len), ref_lse), kFp32Tol)
          << backend_name(be->id()) << " lse len " << len;
      start += len;
    }
  }
}

// The BSHD view of a [B, H, S, D] tensor: dimensions 1 and 2 swapped, no copy.
TensorView bshd_view_of_bhsd(const Tensor& bhsd) {
  TensorView v = bhsd.view();
  std::swap(v.shape[1], v.shape[2]);
  std::swap(v.stride[1], v.stride[2]);
  return v;
}

// A copy of a BSHD tensor stored as [B, H, S, D].
Tensor to_bhsd(const Tensor& bshd) {
  Tensor t = Tensor::empty({bshd.size(0), bshd.size(2), bshd.size(1), bshd.size(3)}, bshd.dtype());
  copy(bshd_view_of_bhsd(t), bshd);
  return t;
}

// A BHSD tensor passed as a strided BSHD view gives the same result as the contiguous BSHD copy.
TEST(CpuBackends, StridedViewsMatchContiguous) {
  std::mt19937_64 rng(testing::fresh_seed());
  AttnProblem pr = make_problem(2, 4, 2, 32, 45, 45, MaskType::CausalTopLeft, DType::F32, rng);
  AttnResult ref = run_backend(flash(), pr, DType::F32);
  const Tensor q = to_bhsd(pr.q), k = to_bhsd(pr.k), v = to_bhsd(pr.v), dout = to_bhsd(pr.dout);
  Tensor o = Tensor::empty({2, 45, 4, 32}, DType::F32), lse = Tensor::empty({2, 4, 45}, DType::F32);
  Tensor dq = Tensor::empty({2, 45, 4, 32}, DType::F32), dk = Tensor::empty({2, 45, 2, 32}, DType::F32),
         dv = Tensor::empty({2, 45, 2, 32}, DType::F32);
  for (const Tensor* t : {&o, &lse, &dq, &dk, &dv}) testing::poison(*t);
  attention::AttnForwardArgs f{bshd_view_of_bhsd(q), bshd_view_of_bhsd(k), bshd_view_of_bhsd(v), o, lse};
  attention::validate(pr.p, f);
  flash().forward(pr.p, f);
  attention::AttnBackwardArgs b{bshd_view_of_bhsd(q), bshd_view_of_bhsd(k), bshd_view_of_bhsd(v), o,
                                bshd_view_of_bhsd(dout), lse, dq, dk, dv};
  attention::validate(pr.p, b);
  flash().backward(pr.p, b);
  // Same arithmetic in the same order: only the addresses differ.
  EXPECT_EQ(rel_error(o, ref.o), 0.0);
  EXPECT_EQ(rel_error(dq, ref.dq), 0.0);
  EXPECT_EQ(rel_error(dk, ref.dk), 0.0);
  EXPECT_EQ(rel_error(dv, ref.dv), 0.0);
}

// accumulate=true adds the gradients into existing fp32 buffers.
TEST(CpuBackends, AccumulateAddsIntoFp32Buffers) {
  std::mt19937_64 rng(testing::fresh_seed());
  AttnProblem pr = make_problem(1, 4, 2, 32, 50, 50, MaskType::CausalTopLeft, DType::F32, rng);
  for (const attention::Backend* be : {&math(), &flash()}) {
    AttnResult r = run_backend(*be, pr, DType::F32);
    Tensor base_dq = Tensor::empty({1, 50, 4, 32}, DType::F32), base_dk = Tensor::empty({1, 50, 2, 32}, DType::F32),
           base_dv = Tensor::empty({1, 50, 2, 32}, DType::F32);
    for (const Tensor* t : {&base_dq, &base_dk, &base_dv}) testing::fill_normal(*t, rng);
    Tensor acc_dq = Tensor::empty({1, 50, 4, 32}, DType::F32), acc_dk = Tensor::empty({1, 50, 2, 32}, DType::F32),
           acc_dv = Tensor::empty({1, 50, 2, 32}, DType::F32);
    copy(acc_dq, base_dq);
    copy(acc_dk, base_dk);
    copy(acc_dv, base_dv);
    attention::AttnBackwardArgs b{pr.q, pr.k, pr.v, r.o, pr.dout, r.lse, acc_dq, acc_dk, acc_dv, true};
    attention::validate(pr.p, b);
    be->backward(pr.p, b);
    for (auto [acc, base, grad] : {std::tuple{&acc_dq, &base_dq, &r.dq}, {&acc_dk, &base_dk, &r.dk},
                                   {&acc_dv, &base_dv, &r.dv}}) {
      Tensor want = Tensor::empty({acc->size(0), acc->size(1), acc->size(2), acc->size(3)}, DType::F32);
      for (int64_t i = 0; i < want.numel(); ++i) want.ptr<float>()[i] = base->ptr<float>()[i] + grad->ptr<float>()[i];
      EXPECT_LE(rel_error(*acc, want), 1e-6) << backend_name(be->id());
    }
  }
}

// bf16 inputs: flash (fp32 accumulation, bf16 outputs) against math in fp64 on the same bf16 inputs. Rounding the
// outputs to bf16 (8 mantissa bits) alone gives ~2e-3 relative error; 1e-2 is the project's bf16 bar.
TEST(CpuBackends, Bf16FlashWithinBf16Tolerance) {
  std::mt19937_64 rng(testing::fresh_seed());
  AttnProblem pr = make_problem(1, 4, 2, 64, 80, 80, MaskType::CausalTopLeft, DType::BF16, rng);
  AttnResult ref = run_backend(math(), pr, DType::F64);
  AttnResult got = run_backend(flash(), pr, DType::BF16);
  expect_close(got, ref, 1e-2);
}

}  // namespace
}  // namespace ringtrain
