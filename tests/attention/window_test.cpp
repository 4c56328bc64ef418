// Sliding-window attention (AttnParams::window) on the CPU:
//  - key_start/key_limit against Hugging Face's definition (key j visible to the query at position i when j <= i and
//    i - j < w) written out here;
//  - CPU math and CPU flash with a window against the fp64 math backend without one, the window encoded as a dense
//    additive -inf bias (forward and backward, both causal alignments, Sq <, = and > Skv, windows of one key, inside
//    a tile, across tiles and longer than the sequence);
//  - packed (THD) windowed calls against per-sequence dense ones;
//  - validation messages, and the reports of the backends that decline a window.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <tuple>

#include "attention_test_util.h"
#include "ringtrain/attention/selection.h"
#include "ringtrain/core/error.h"
#include "window_reference.h"

namespace ringtrain {
namespace {

using testing::hf_visible;

using attention::AttnBackwardArgs;
using attention::AttnForwardArgs;
using attention::AttnParams;
using attention::BackendId;
using attention::MaskType;
using testing::AttnProblem;
using testing::AttnResult;

const attention::Backend& cpu(BackendId id) { return *attention::find_backend(id, DeviceKind::CPU); }

// A copy of a 4-D view in another dtype.
Tensor copy_as(const TensorView& v, DType dtype) {
  Tensor t = Tensor::empty({v.shape[0], v.shape[1], v.shape[2], v.shape[3]}, dtype);
  copy(t, v);
  return t;
}

// Rows [start, start + n) of a THD tensor [T, H, D] (or of an LSE [H, T], along its last dimension) as a batch of one.
TensorView one_sequence(const TensorView& thd, int64_t start, int64_t n) {
  TensorView v;
  v.data = thd.data, v.dtype = thd.dtype, v.device = thd.device;
  if (thd.ndim == 2) {  // LSE [H, T] -> [1, H, n]
    v.data = static_cast<char*>(thd.data) + start * thd.stride[1] * dtype_size(thd.dtype);
    v.ndim = 3, v.shape = {1, thd.shape[0], n}, v.stride = {0, thd.stride[0], thd.stride[1]};
    return v;
  }
  v.data = static_cast<char*>(thd.data) + start * thd.stride[0] * dtype_size(thd.dtype);
  v.ndim = 4, v.shape = {1, n, thd.shape[1], thd.shape[2]}, v.stride = {0, thd.stride[0], thd.stride[1], 1};
  return v;
}

TEST(WindowConvention, KeyRangeIsHuggingFacesSlidingWindow) {
  for (MaskType m : {MaskType::CausalTopLeft, MaskType::CausalBottomRight})
    for (auto [sq, skv] : {std::pair<int64_t, int64_t>{9, 9}, {4, 13}, {13, 4}, {1, 7}})
      for (int64_t w : {0, 1, 2, 3, 5, 12, 40})
        for (int64_t i = 0; i < sq; ++i) {
          const int64_t first = attention::key_start(m, w, i, sq, skv), lim = attention::key_limit(m, i, sq, skv);
          for (int64_t j = 0; j < skv; ++j)
            EXPECT_EQ(j >= first && j < lim, hf_visible(m, w, i, j, sq, skv))
                << attention::mask_name(m) << " w " << w << " Sq " << sq << " Skv " << skv << " i " << i << " j " << j;
        }
  // Without a causal mask there is no window (validation refuses one).
  EXPECT_EQ(attention::key_start(MaskType::None, 3, 5, 9, 9), 0);
}

// The fp64 math backend on the problem without a window, with the window as a bias instead; outputs poisoned first.
AttnResult reference(const AttnProblem& pr) {
  const testing::WindowReference r = testing::window_bias_reference(pr.p, pr.q, pr.k, pr.v, pr.dout);
  return {r.o, r.lse, r.dq, r.dk, r.dv};
}

void expect_close(const AttnResult& a, const AttnResult& ref, double tol) {
  EXPECT_LE(testing::rel_error(a.o, ref.o), tol) << "O";
  EXPECT_LE(testing::rel_error(a.lse, ref.lse), tol) << "LSE";
  EXPECT_LE(testing::rel_error(a.dq, ref.dq), tol) << "dQ";
  EXPECT_LE(testing::rel_error(a.dk, ref.dk), tol) << "dK";
  EXPECT_LE(testing::rel_error(a.dv, ref.dv), tol) << "dV";
}

// (mask, seqlen_q, seqlen_kv, window)
using Case = std::tuple<MaskType, int, int, int>;
class CpuWindow : public ::testing::TestWithParam<Case> {};

TEST_P(CpuWindow, MathAndFlashMatchDenseBiasReference) {
  const auto [mask, sq, skv, w] = GetParam();
  std::mt19937_64 rng(testing::fresh_seed());
  AttnProblem pr = testing::make_problem(2, 4, 2, 32, sq, skv, mask, DType::F64, rng);
  pr.p.window = w;
  const AttnResult ref = reference(pr);
  // fp64 throughout: only the summation order differs (the bias run adds exp(-inf) = 0 terms, the window skips them).
  expect_close(testing::run_backend(cpu(BackendId::Math), pr, DType::F64), ref, 1e-12);
  AttnProblem pr32 = pr;
  for (Tensor* t : {&pr32.q, &pr32.k, &pr32.v, &pr32.dout}) *t = copy_as(*t, DType::F32);
  pr32.p.dtype = DType::F32;
  // fp32 accumulation over at most a few hundred keys (cpu_backends_test.cpp's tolerance).
  expect_close(testing::run_backend(cpu(BackendId::Flash), pr32, DType::F32), ref, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(
    Windows, CpuWindow,
    ::testing::Values(Case{MaskType::CausalTopLeft, 200, 200, 1}, Case{MaskType::CausalTopLeft, 200, 200, 17},
                      Case{MaskType::CausalTopLeft, 200, 200, 64}, Case{MaskType::CausalTopLeft, 200, 200, 150},
                      Case{MaskType::CausalTopLeft, 200, 200, 500}, Case{MaskType::CausalBottomRight, 70, 230, 45},
                      Case{MaskType::CausalBottomRight, 70, 230, 130}, Case{MaskType::CausalBottomRight, 230, 70, 33},
                      Case{MaskType::CausalTopLeft, 70, 230, 20}, Case{MaskType::CausalTopLeft, 230, 70, 100},
                      Case{MaskType::CausalBottomRight, 1, 300, 64}));

// Packed sequences: each sequence's window is its own (positions restart at every sequence).
TEST(CpuWindowPacked, MatchesPerSequenceDenseCalls) {
  std::mt19937_64 rng(testing::fresh_seed());
  const std::vector<int64_t> lens = {37, 150, 1, 90};
  const int64_t hq = 4, hkv = 2, d = 16, w = 29, total = 278;
  Tensor q = Tensor::empty({total, hq, d}, DType::F32), k = Tensor::empty({total, hkv, d}, DType::F32);
  Tensor v = Tensor::empty({total, hkv, d}, DType::F32), dout = Tensor::empty({total, hq, d}, DType::F32);
  for (const Tensor* t : {&q, &k, &v, &dout}) testing::fill_normal(*t, rng);
  Tensor cu = Tensor::empty({5}, DType::I32);
  cu.ptr<int32_t>()[0] = 0;
  for (int b = 0; b < 4; ++b) cu.ptr<int32_t>()[b + 1] = cu.ptr<int32_t>()[b] + static_cast<int32_t>(lens[b]);
  AttnParams p;
  p.dtype = DType::F32, p.batch = 4, p.heads_q = hq, p.heads_kv = hkv, p.head_dim = d;
  p.seqlen_q = p.seqlen_kv = 150, p.mask = MaskType::CausalTopLeft, p.packed = true, p.window = w;
  for (BackendId id : {BackendId::Math, BackendId::Flash}) {
    Tensor o = Tensor::empty({total, hq, d}, DType::F32), lse = Tensor::empty({hq, total}, DType::F32);
    Tensor dq = Tensor::empty({total, hq, d}, DType::F32), dk = Tensor::empty({total, hkv, d}, DType::F32);
    Tensor dv = Tensor::empty({total, hkv, d}, DType::F32);
    for (const Tensor* t : {&o, &lse, &dq, &dk, &dv}) testing::poison(*t);
    AttnForwardArgs f{q, k, v, o, lse, cu, cu};
    attention::validate(p, f);
    cpu(id).forward(p, f);
    AttnBackwardArgs bw{q, k, v, o, dout, lse, dq, dk, dv};
    bw.cu_seqlens_q = bw.cu_seqlens_kv = cu;
    attention::validate(p, bw);
    cpu(id).backward(p, bw);
    int64_t start = 0;
    for (int b = 0; b < 4; ++b) {
      const int64_t n = lens[b];
      AttnProblem pr;
      for (auto [dst, src] : {std::pair<Tensor*, Tensor*>{&pr.q, &q}, {&pr.k, &k}, {&pr.v, &v}, {&pr.dout, &dout}})
        *dst = copy_as(one_sequence(*src, start, n), DType::F64);
      pr.p = attention::params_for(pr.q, pr.k, MaskType::CausalTopLeft);
      pr.p.window = w;
      const AttnResult ref = reference(pr);
      const auto rows = [&](const Tensor& t) { return one_sequence(t, start, n); };
      const std::string at = cat(attention::backend_name(id), " sequence ", b);
      EXPECT_LE(testing::rel_error(rows(o), ref.o), 1e-5) << at << " O";
      EXPECT_LE(testing::rel_error(rows(lse), ref.lse), 1e-5) << at << " LSE";
      EXPECT_LE(testing::rel_error(rows(dq), ref.dq), 1e-5) << at << " dQ";
      EXPECT_LE(testing::rel_error(rows(dk), ref.dk), 1e-5) << at << " dK";
      EXPECT_LE(testing::rel_error(rows(dv), ref.dv), 1e-5) << at << " dV";
      start += n;
    }
  }
}

TEST(WindowValidation, RefusesBadWindowsNamingTheValue) {
  AttnParams p;
  p.seqlen_q = p.seqlen_kv = 16, p.mask = MaskType::CausalTopLeft;
  const auto message = [&](int64_t w, MaskType m) {
    p.window = w, p.mask = m;
    try {
      attention::validate_params(p);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message(-1, MaskType::CausalTopLeft).find("sliding window -1"), std::string::npos);
  EXPECT_NE(message(int64_t{1} << 31, MaskType::CausalBottomRight).find("sliding window 2147483648"),
            std::string::npos);
  EXPECT_NE(message(8, MaskType::None).find("needs a causal mask"), std::string::npos);
  EXPECT_EQ(message(8, MaskType::CausalBottomRight), "");
  EXPECT_EQ(message((int64_t{1} << 31) - 1, MaskType::CausalTopLeft), "");
}

TEST(WindowSelection, KeyAndDescriptionCarryTheWindow) {
  AttnParams a;
  a.seqlen_q = a.seqlen_kv = 16, a.mask = MaskType::CausalTopLeft;
  AttnParams b = a;
  b.window = 4;
  EXPECT_NE(a.key(), b.key());
  EXPECT_NE(b.describe().find("window=4"), std::string::npos) << b.describe();
  EXPECT_EQ(a.describe().find("window"), std::string::npos) << a.describe();
}

// Every CUDA backend of this build either serves a window or names it among its reasons, so the selection report
// always says why (checked from the params alone: the reasons are listed whether or not a GPU is present).
TEST(WindowSelection, EveryBackendServesTheWindowOrSaysWhy) {
  AttnParams p;
  p.dtype = DType::BF16, p.heads_q = 8, p.heads_kv = 2, p.head_dim = 64, p.seqlen_q = p.seqlen_kv = 256;
  p.mask = MaskType::CausalTopLeft;
  int checked = 0;
  for (DeviceKind kind : {DeviceKind::CPU, DeviceKind::CUDA}) {
    p.device = kind == DeviceKind::CPU ? Device::cpu() : Device::cuda(0);
    for (BackendId id : attention::default_backends()) {
      const attention::Backend* be = attention::find_backend(id, kind);
      if (!be) continue;
      ++checked;
      p.window = 0;
      const auto plain = be->unsupported_reasons(p);
      p.window = 100;
      const auto windowed = be->unsupported_reasons(p);
      const bool names_window = std::any_of(windowed.begin(), windowed.end(), [](const std::string& r) {
        return r.find("sliding window 100") != std::string::npos;
      });
      EXPECT_TRUE(windowed.size() == plain.size() || (names_window && windowed.size() == plain.size() + 1))
          << attention::backend_name(id) << " on " << device_name(p.device);
    }
  }
  EXPECT_GE(checked, 2);
  // Both CPU backends serve it: the selection picks one.
  p.device = Device::cpu(), p.dtype = DType::F32, p.window = 100;
  EXPECT_NE(attention::explain(p).backend, nullptr) << attention::explain(p).report();
}

}  // namespace
}  // namespace ringtrain
