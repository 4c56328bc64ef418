// The CUDA `efficient` backend against the fp64 CPU math reference, on fresh random inputs with NaN-poisoned
// outputs: O, LSE, dQ, dK, dV for fp32 / bf16 / fp16, head dims 8..256 (tensor-core path up to 128, SIMT above and
// for fp32), lengths that are not tile multiples, Sq != Skv with both causal alignments (incl. rows that see no key),
// GQA 32/8 and MQA, additive bias (full and broadcast, bf16/fp32, with -inf entries and a fully hidden row), packed
// odd lengths, fp32 accumulate, the deterministic mode, and S = 131072 (row slices against a reference computed for
// those rows). `EfficientCuda.*Small*` are small enough to run under compute-sanitizer.
//
// Tolerances (relative L2 error against fp64 on the same dtype-rounded inputs):
//  - fp32 (SIMT, exact fp32 FMAs and expf, no TF32): 1e-5. Errors are fp32 rounding over dot products of <= 256 terms
//    and sums over <= 4097 keys (~1e-6 expected, as the GPU math backend sees).
//  - bf16: 1e-2; fp16: 5e-3. On the tensor-core path P and dS are rounded to the dtype before their products and O /
//    gradients are stored in the dtype (bf16 2^-9 relative per element); typical values are printed by each test.
//  - LSE is fp32 arithmetic either way: max abs 1e-3 for 16-bit (scores from 16-bit products), 1e-4 for fp32.
#include <cmath>
#include <cstring>
#include <limits>

#include "gpu_attention_harness.h"
#include "ringtrain/attention/cpu/cpu_backends.h"

namespace ringtrain {
namespace {

using attention::AttnParams;
using attention::BackendId;
using attention::MaskType;
using namespace testing::gpu;

const attention::Backend* gpu_efficient() { return gpu_backend(BackendId::Efficient); }

struct BiasSpec {
  bool on = false;
  bool batch_broadcast = false;  // bias [1, Hq, Sq, Skv]
  bool head_broadcast = false;   // bias [B, 1, Sq, Skv]
  DType dtype = DType::F32;
  double hidden_fraction = 0.0;  // entries set to -inf
  int64_t hidden_row = -1;       // a query row whose every key is hidden (LSE -inf, O 0, no gradient)
};

// N(0, 1) bias with some -inf entries; the reference and the GPU read the same values.
void add_bias(Problem& pr, const BiasSpec& spec, std::mt19937_64& rng) {
  if (!spec.on) return;
  auto& p = pr.p;
  p.has_bias = true;
  pr.bias = host_tensor({spec.batch_broadcast ? 1 : p.batch, spec.head_broadcast ? 1 : p.heads_q, p.seqlen_q,
                         p.seqlen_kv},
                        spec.dtype);
  testing::fill_normal(pr.bias, rng);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const int64_t n = pr.bias.numel(), skv = p.seqlen_kv;
  for (int64_t i = 0; i < n; ++i) {
    const bool hidden_row = (i / skv) % p.seqlen_q == spec.hidden_row;
    if (hidden_row || u(rng) < spec.hidden_fraction)
      store_from_double(pr.bias.data(), spec.dtype, i, -std::numeric_limits<double>::infinity());
  }
}

Errors check(const Case& c, const BiasSpec& bias, double tol, double lse_tol, const char* what,
             bool deterministic = false) {
  const attention::Backend* be = gpu_efficient();
  if (!be) return {};
  std::mt19937_64 rng(testing::fresh_seed());
  Problem pr = make_problem(c, rng);
  add_bias(pr, bias, rng);
  pr.p.deterministic = deterministic;
  AttnParams gp = pr.p;
  gp.device = Device::cuda();
  const auto reasons = be->unsupported_reasons(gp);
  EXPECT_TRUE(reasons.empty()) << reasons.front();
  if (!reasons.empty()) return {};
  const Result got = run_gpu(*be, c, pr);
  const Result ref = run_cpu(cpu_math(), c, pr);
  const Errors e = compare(got, ref);
  e.print(what);
  expect_within(e, tol, lse_tol);
  return e;
}

Case make_case(DType dtype, int64_t d, int64_t sq, int64_t skv, MaskType mask, int64_t hq = 4, int64_t hkv = 2,
               int64_t batch = 1) {
  Case c;
  c.dtype = c.out_dtype = dtype;
  c.batch = batch, c.hq = hq, c.hkv = hkv, c.d = d, c.sq = sq, c.skv = skv;
  c.mask = mask;
  return c;
}

double tol_of(DType t) { return t == DType::F32 ? 1e-5 : t == DType::F16 ? 5e-3 : 1e-2; }
double lse_tol_of(DType t) { return t == DType::F32 ? 1e-4 : 1e-3; }

// --- small cases (compute-sanitizer) ---------------------------------------------------------------------------

TEST(EfficientCuda, SmallBf16D40CausalBiasHiddenRow) {
  RT_REQUIRE_GPU();
  BiasSpec b{true, false, false, DType::BF16, 0.1, 5};
  check(make_case(DType::BF16, 40, 77, 77, MaskType::CausalTopLeft), b, 1e-2, 1e-3, "small bf16 D=40 causal bias");
}

TEST(EfficientCuda, SmallFp32D24BottomRightBias) {
  RT_REQUIRE_GPU();
  BiasSpec b{true, true, false, DType::F32, 0.1, 3};
  check(make_case(DType::F32, 24, 50, 37, MaskType::CausalBottomRight), b, 1e-5, 1e-4, "small fp32 D=24 bottom-right");
}

TEST(EfficientCuda, SmallFp16D256NoMask) {
  RT_REQUIRE_GPU();
  check(make_case(DType::F16, 256, 45, 70, MaskType::None, 2, 1), {}, 5e-3, 1e-3, "small fp16 D=256 MQA");
}

TEST(EfficientCuda, SmallPackedBf16D64Deterministic) {
  RT_REQUIRE_GPU();
  Case c;
  c.dtype = c.out_dtype = DType::BF16;
  c.hq = 4, c.hkv = 2, c.d = 64;
  c.q_lens = {1, 33, 0, 70};
  c.kv_lens = {1, 33, 0, 70};
  c.mask = MaskType::CausalTopLeft;
  check(c, {}, 1e-2, 1e-3, "small packed bf16 deterministic", true);
}

// q and dO start 2 bytes past an aligned address (rows not 16-byte aligned): the tensor-core kernels cannot copy
// them, so the call takes the SIMT kernels and must give the same results.
TEST(EfficientCuda, SmallMisalignedRowsTakeTheSimtPath) {
  RT_REQUIRE_GPU();
  const attention::Backend* be = gpu_efficient();
  ASSERT_NE(be, nullptr);
  const Case c = make_case(DType::BF16, 64, 100, 90, MaskType::CausalBottomRight, 4, 2);
  std::mt19937_64 rng(testing::fresh_seed());
  const Problem pr = make_problem(c, rng);
  const Result ref = run_cpu(cpu_math(), c, pr);
  auto shifted = [](const Tensor& host, Tensor& storage) {
    storage = device_tensor({host.numel() + 1}, host.dtype());
    TensorView v = host.view();
    v.device = Device::cuda();
    v.data = static_cast<char*>(storage.data()) + dtype_size(host.dtype());
    copy(v, host);
    return v;
  };
  Tensor q_store, do_store;
  const TensorView q = shifted(pr.q, q_store), dout = shifted(pr.dout, do_store);
  const Tensor k = upload(pr.k), v = upload(pr.v);
  const Tensor o = poisoned_device(shape_of(pr.q), DType::BF16), lse = poisoned_device(lse_shape(pr), DType::F32);
  const Tensor dq = poisoned_device(shape_of(pr.q), DType::BF16), dk = poisoned_device(shape_of(pr.k), DType::BF16);
  const Tensor dv = poisoned_device(shape_of(pr.k), DType::BF16);
  AttnParams p = pr.p;
  p.device = Device::cuda();
  be->forward(p, {q, k, v, o, lse});
  be->backward(p, {q, k, v, o, dout, lse, dq, dk, dv});
  synchronize(Device::cuda(0));
  const Errors e = compare({download(o), download(lse), download(dq), download(dk), download(dv)}, ref);
  e.print("misaligned bf16 rows (SIMT path)");
  expect_within(e, 1e-2, 1e-3);
}

// --- head dims and dtypes ----------------------------------------------------------------------------------------

class EfficientHeadDims : public ::testing::TestWithParam<std::tuple<DType, int64_t>> {};

TEST_P(EfficientHeadDims, Causal1000GqaMatchesCpu) {
  RT_REQUIRE_GPU();
  const auto [dtype, d] = GetParam();
  const std::string what = cat(dtype_name(dtype), " D=", d, " causal S=1000 GQA 4/2");
  check(make_case(dtype, d, 1000, 1000, MaskType::CausalTopLeft), {}, tol_of(dtype), lse_tol_of(dtype), what.c_str());
}

INSTANTIATE_TEST_SUITE_P(EfficientCuda, EfficientHeadDims,
                         ::testing::Combine(::testing::Values(DType::F32, DType::BF16, DType::F16),
                                            ::testing::Values(8, 40, 64, 96, 128, 256)),
                         [](const auto& info) {
                           return cat(dtype_name(std::get<0>(info.param)), "_D", std::get<1>(info.param));
                         });

TEST(EfficientCuda, Bf16D128Length4097NoMaskBatch2) {
  RT_REQUIRE_GPU();
  check(make_case(DType::BF16, 128, 4097, 4097, MaskType::None, 4, 4, 2), {}, 1e-2, 1e-3, "bf16 D=128 S=4097 B=2");
}

TEST(EfficientCuda, Fp32D96Length4097Causal) {
  RT_REQUIRE_GPU();
  check(make_case(DType::F32, 96, 4097, 4097, MaskType::CausalTopLeft, 2, 1), {}, 1e-5, 1e-4, "fp32 D=96 S=4097");
}

// Sq > Skv bottom-right: the first Sq - Skv rows see no key (LSE -inf, O 0, no gradient).
TEST(EfficientCuda, Bf16BottomRightSqGreaterThanSkvEmptyRows) {
  RT_REQUIRE_GPU();
  check(make_case(DType::BF16, 64, 4097, 3001, MaskType::CausalBottomRight), {}, 1e-2, 1e-3,
        "bf16 bottom-right Sq=4097 Skv=3001");
}

TEST(EfficientCuda, Fp16BottomRightSqLessThanSkv) {
  RT_REQUIRE_GPU();
  check(make_case(DType::F16, 128, 1000, 4097, MaskType::CausalBottomRight, 4, 1), {}, 5e-3, 1e-3,
        "fp16 MQA bottom-right Sq=1000 Skv=4097");
}

TEST(EfficientCuda, Bf16Gqa32x8Causal1000) {
  RT_REQUIRE_GPU();
  check(make_case(DType::BF16, 128, 1000, 1000, MaskType::CausalTopLeft, 32, 8), {}, 1e-2, 1e-3,
        "bf16 GQA 32/8 causal S=1000");
}

TEST(EfficientCuda, Fp32MqaTopLeftSqLessThanSkv) {
  RT_REQUIRE_GPU();
  check(make_case(DType::F32, 40, 333, 1000, MaskType::CausalTopLeft, 8, 1), {}, 1e-5, 1e-4,
        "fp32 MQA 8/1 top-left Sq=333 Skv=1000");
}

// --- bias ------------------------------------------------------------------------------------------------------------

TEST(EfficientCuda, Bf16FullBiasCausalWithHiddenEntriesAndRow) {
  RT_REQUIRE_GPU();
  BiasSpec b{true, false, false, DType::BF16, 0.05, 17};
  check(make_case(DType::BF16, 128, 1000, 1000, MaskType::CausalTopLeft, 4, 2, 2), b, 1e-2, 1e-3,
        "bf16 full bf16 bias B=2 causal");
}

TEST(EfficientCuda, Fp16BatchBroadcastFp32BiasNoMask) {
  RT_REQUIRE_GPU();
  BiasSpec b{true, true, false, DType::F32, 0.2, 999};
  check(make_case(DType::F16, 64, 1000, 777, MaskType::None, 4, 4, 2), b, 5e-3, 1e-3,
        "fp16 bias [1,H,Sq,Skv] fp32, no mask, Sq != Skv");
}

TEST(EfficientCuda, Fp32HeadBroadcastBiasBottomRight) {
  RT_REQUIRE_GPU();
  BiasSpec b{true, false, true, DType::F32, 0.1, 0};
  check(make_case(DType::F32, 64, 1000, 1200, MaskType::CausalBottomRight, 4, 2, 2), b, 1e-5, 1e-4,
        "fp32 bias [B,1,Sq,Skv] bottom-right");
}

TEST(EfficientCuda, Bf16D256BiasSimtPath) {
  RT_REQUIRE_GPU();
  BiasSpec b{true, true, true, DType::BF16, 0.1, 200};
  check(make_case(DType::BF16, 256, 1000, 1000, MaskType::CausalTopLeft), b, 1e-2, 1e-3, "bf16 D=256 bias [1,1,S,S]");
}

// --- packed, accumulate, deterministic ---------------------------------------------------------------------------

TEST(EfficientCuda, PackedOddLengthsBf16AndFp32) {
  RT_REQUIRE_GPU();
  for (DType t : {DType::BF16, DType::F32}) {
    Case c;
    c.dtype = c.out_dtype = t;
    c.hq = 8, c.hkv = 2, c.d = 72;
    c.q_lens = {1, 77, 513, 1000, 0, 31};
    c.kv_lens = {1, 77, 513, 1000, 0, 31};
    c.mask = MaskType::CausalTopLeft;
    check(c, {}, tol_of(t), lse_tol_of(t), t == DType::F32 ? "packed fp32 D=72" : "packed bf16 D=72");
  }
}

TEST(EfficientCuda, PackedCrossLengthsBottomRightFp16) {
  RT_REQUIRE_GPU();
  Case c;
  c.dtype = c.out_dtype = DType::F16;
  c.hq = 4, c.hkv = 4, c.d = 64;
  c.q_lens = {5, 300, 129};
  c.kv_lens = {17, 100, 1000};
  c.mask = MaskType::CausalBottomRight;
  check(c, {}, 5e-3, 1e-3, "packed fp16 Sq != Skv bottom-right");
}

TEST(EfficientCuda, Bf16Fp32OutputsAccumulate) {
  RT_REQUIRE_GPU();
  for (int64_t d : {64, 256}) {
    Case c = make_case(DType::BF16, d, 1000, 1000, MaskType::CausalTopLeft, 4, 2);
    c.out_dtype = DType::BF16;
    c.accumulate = true;
    check(c, {}, 1e-2, 1e-3, d == 64 ? "bf16 accumulate D=64" : "bf16 accumulate D=256");
  }
}

TEST(EfficientCuda, StridedDoutBf16) {
  RT_REQUIRE_GPU();
  Case c = make_case(DType::BF16, 128, 1000, 1000, MaskType::CausalTopLeft, 4, 2);
  c.bhsd_dout = true;
  check(c, {}, 1e-2, 1e-3, "bf16 dO with BHSD strides");
}

TEST(EfficientCuda, DeterministicModeIsCorrectAndRepeatable) {
  RT_REQUIRE_GPU();
  const attention::Backend* be = gpu_efficient();
  ASSERT_NE(be, nullptr);
  for (DType t : {DType::BF16, DType::F32}) {
    Case c = make_case(t, 64, 1000, 1000, MaskType::CausalTopLeft, 8, 2);
    std::mt19937_64 rng(testing::fresh_seed());
    Problem pr = make_problem(c, rng);
    pr.p.deterministic = true;
    const Result a = run_gpu(*be, c, pr), b = run_gpu(*be, c, pr);
    EXPECT_EQ(std::memcmp(a.dq.data(), b.dq.data(), a.dq.nbytes()), 0) << "dQ differs between runs";
    EXPECT_EQ(std::memcmp(a.dk.data(), b.dk.data(), a.dk.nbytes()), 0) << "dK differs between runs";
    EXPECT_EQ(std::memcmp(a.dv.data(), b.dv.data(), a.dv.nbytes()), 0) << "dV differs between runs";
    const Errors e = compare(a, run_cpu(cpu_math(), c, pr));
    e.print(t == DType::F32 ? "deterministic fp32" : "deterministic bf16");
    expect_within(e, tol_of(t), lse_tol_of(t));
  }
}

// --- S = 131072 --------------------------------------------------------------------------------------------------
// Causal, bf16, GQA 2/1. The reference is computed for three slices of query rows only (with all the keys they see,
// bottom-right aligned); the last slice's keys are seen by the last slice's queries alone, so dK/dV of those keys
// are complete in that slice's reference. Every other gradient element must be finite (written, no NaN).
TEST(EfficientCuda, Bf16Causal131072RowSlices) {
  RT_REQUIRE_GPU();
  const attention::Backend* be = gpu_efficient();
  ASSERT_NE(be, nullptr);
  constexpr int64_t S = 131072, H = 2, D = 128, n = 32;
  std::mt19937_64 rng(testing::fresh_seed());
  Tensor q = host_tensor({1, S, H, D}, DType::BF16), k = host_tensor({1, S, 1, D}, DType::BF16);
  Tensor v = host_tensor({1, S, 1, D}, DType::BF16), dout = host_tensor({1, S, H, D}, DType::BF16);
  for (const Tensor* t : {&q, &k, &v, &dout}) testing::fill_normal(*t, rng);
  AttnParams p = attention::params_for(q, k, MaskType::CausalTopLeft);
  p.device = Device::cuda();
  const Tensor qd = upload(q), kd = upload(k), vd = upload(v), dod = upload(dout);
  const Tensor o = poisoned_device({1, S, H, D}, DType::BF16), lse = poisoned_device({1, H, S}, DType::F32);
  const Tensor gq = poisoned_device({1, S, H, D}, DType::BF16), gk = poisoned_device({1, S, 1, D}, DType::BF16);
  const Tensor gv = poisoned_device({1, S, 1, D}, DType::BF16);
  be->forward(p, {qd, kd, vd, o, lse});
  be->backward(p, {qd, kd, vd, o, dod, lse, gq, gk, gv});
  synchronize(Device::cuda(0));
  const Tensor o_h = download(o), lse_h = download(lse), dq_h = download(gq), dk_h = download(gk), dv_h = download(gv);

  for (int64_t r0 : {int64_t(0), S / 2 - 37, S - n}) {
    const TensorView qs = q.view().slice(1, r0, n), dos = dout.view().slice(1, r0, n);
    const TensorView ks = k.view().slice(1, 0, r0 + n), vs = v.view().slice(1, 0, r0 + n);
    const AttnParams ps = attention::params_for(qs, ks, MaskType::CausalBottomRight);
    Tensor o_ref = host_tensor({1, n, H, D}, DType::F64), lse_ref = host_tensor({1, H, n}, DType::F32);
    cpu_math().forward(ps, {qs, ks, vs, o_ref, lse_ref});
    Tensor dq_ref = host_tensor({1, n, H, D}, DType::F64);
    Tensor dk_ref = host_tensor({1, r0 + n, 1, D}, DType::F64), dv_ref = host_tensor({1, r0 + n, 1, D}, DType::F64);
    cpu_math().backward(ps, {qs, ks, vs, o_ref, dos, lse_ref, dq_ref, dk_ref, dv_ref});
    const double e_o = testing::rel_error(o_h.view().slice(1, r0, n), o_ref);
    const double e_lse = testing::max_abs_error(lse_h.view().slice(2, r0, n), lse_ref);
    const double e_dq = testing::rel_error(dq_h.view().slice(1, r0, n), dq_ref);
    std::printf("[efficient S=%lld rows %lld..%lld] rel err O %.2e dQ %.2e; LSE max abs %.2e\n",
                static_cast<long long>(S), static_cast<long long>(r0), static_cast<long long>(r0 + n), e_o, e_dq,
                e_lse);
    EXPECT_LE(e_o, 1e-2) << "O rows " << r0;
    EXPECT_LE(e_lse, 1e-3) << "LSE rows " << r0;
    EXPECT_LE(e_dq, 1e-2) << "dQ rows " << r0;
    if (r0 == S - n) {
      const double e_dk = testing::rel_error(dk_h.view().slice(1, r0, n), dk_ref.view().slice(1, r0, n));
      const double e_dv = testing::rel_error(dv_h.view().slice(1, r0, n), dv_ref.view().slice(1, r0, n));
      std::printf("[efficient S=%lld keys %lld..%lld] rel err dK %.2e dV %.2e\n", static_cast<long long>(S),
                  static_cast<long long>(r0), static_cast<long long>(S), e_dk, e_dv);
      EXPECT_LE(e_dk, 1e-2) << "dK of the last keys";
      EXPECT_LE(e_dv, 1e-2) << "dV of the last keys";
    }
  }
  // max_abs_error(x, x) is 0 unless x holds a NaN (the poison) or an inf.
  EXPECT_EQ(testing::max_abs_error(o_h, o_h), 0.0) << "O has NaN or inf";
  EXPECT_EQ(testing::max_abs_error(dq_h, dq_h), 0.0) << "dQ has NaN or inf";
  EXPECT_EQ(testing::max_abs_error(dk_h, dk_h), 0.0) << "dK has NaN or inf";
  EXPECT_EQ(testing::max_abs_error(dv_h, dv_h), 0.0) << "dV has NaN or inf";
}

// --- declarations and selection ------------------------------------------------------------------------------------

TEST(EfficientCuda, UnsupportedReasonsNameEachRequirement) {
  RT_REQUIRE_GPU();
  const attention::Backend* be = gpu_efficient();
  ASSERT_NE(be, nullptr);
  AttnParams p;
  p.device = Device::cuda();
  p.dtype = DType::F64;
  p.head_dim = 100;
  p.seqlen_q = p.seqlen_kv = 128;
  p.batch = 70000;
  std::string all;
  for (const std::string& r : be->unsupported_reasons(p)) all += r + "; ";
  EXPECT_NE(all.find("dtype fp64"), std::string::npos) << all;
  EXPECT_NE(all.find("head dim 100"), std::string::npos) << all;
  EXPECT_NE(all.find("batch 70000"), std::string::npos) << all;
  p.head_dim = 264;
  all.clear();
  for (const std::string& r : be->unsupported_reasons(p)) all += r + "; ";
  EXPECT_NE(all.find("head dim 264"), std::string::npos) << all;
  p.dtype = DType::F32;
  p.head_dim = 8;
  p.batch = 1;
  p.has_bias = true;
  p.deterministic = true;
  EXPECT_TRUE(be->unsupported_reasons(p).empty() || cuda_arch(0) != 90);
  EXPECT_TRUE(be->cp_capable());  // declared after tests/cp_gpu passed with it on two H200s
}

// The other GPU backends name the bias among their reasons (a declaration: runs in any CUDA build, GPU or not).
TEST(EfficientCuda, FlashAndCudnnDeclineABias) {
  AttnParams p;
  p.device = Device::cuda();
  p.dtype = DType::BF16;
  p.heads_q = p.heads_kv = 4;
  p.head_dim = 128;
  p.seqlen_q = p.seqlen_kv = 1024;
  p.has_bias = true;
  int checked = 0;
  for (BackendId id : {BackendId::Flash, BackendId::Cudnn}) {
    const attention::Backend* be = attention::find_backend(id, DeviceKind::CUDA);
    if (!be) continue;  // not in this build
    std::string all;
    for (const std::string& r : be->unsupported_reasons(p)) all += r + "; ";
    EXPECT_NE(all.find("additive bias"), std::string::npos) << attention::backend_name(id) << ": " << all;
    ++checked;
  }
  if (checked == 0) GTEST_SKIP() << "this build has no GPU flash or cudnn backend (CPU-only build)";
}

// Default order cudnn, flash, efficient, math: a bias or fp32 on the GPU goes to efficient.
TEST(EfficientCuda, SelectedForBiasAndFp32) {
  RT_REQUIRE_GPU();
  if (cuda_arch(0) != 90) GTEST_SKIP() << "the kernels are built for sm_90a";
  attention::set_root_backends(attention::default_backends(), "test default order");
  AttnParams p;
  p.device = Device::cuda();
  p.dtype = DType::BF16;
  p.heads_q = p.heads_kv = 4;
  p.head_dim = 128;
  p.seqlen_q = p.seqlen_kv = 1024;
  p.has_bias = true;
  attention::Selection s = attention::explain(p);
  ASSERT_NE(s.backend, nullptr) << s.report();
  EXPECT_EQ(s.backend->id(), BackendId::Efficient) << s.report();
  p.has_bias = false;
  p.dtype = DType::F32;
  s = attention::explain(p);
  ASSERT_NE(s.backend, nullptr) << s.report();
  EXPECT_EQ(s.backend->id(), BackendId::Efficient) << s.report();
}

}  // namespace
}  // namespace ringtrain
