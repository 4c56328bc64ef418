// The CUDA `flash` backend against the fp64 CPU math reference, on fresh random inputs with NaN-poisoned outputs:
// O, LSE, dQ, dK, dV over odd lengths (not multiples of the tiles), GQA/MQA, both causal alignments with Sq != Skv,
// fully masked rows, packed batches of odd lengths, a strided (BHSD) query, fp32 outputs with accumulate, the
// deterministic mode, and S = 131072 (rows checked against a reference computed for those rows only); head dims 64,
// 128, 192 and 256, with the selection that keeps head dim 256 out of deterministic backwards.
//
// Tolerances (relative L2 error against fp64): bf16 1e-2, fp16 5e-3. Inputs are rounded to the dtype before both
// runs, so the error comes from the kernels' 16-bit operands inside the computation (P and dS are rounded to the
// dtype before their tensor-core products; O and bf16 gradients are stored in the dtype: 2^-9 relative for bf16);
// typical values seen are printed by each test. LSE is fp32 arithmetic on the same rounded inputs: max abs 1e-3.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "ringtrain/attention/backend.h"
#include "ringtrain/attention/selection.h"
#include "ringtrain/core/device_info.h"
#include "ringtrain/core/error.h"
#include "test_util.h"

namespace ringtrain {
namespace {

using attention::AttnBackwardArgs;
using attention::AttnForwardArgs;
using attention::AttnParams;
using attention::MaskType;
using testing::max_abs_error;
using testing::rel_error;

const attention::Backend& gpu_flash() {
  const attention::Backend* be = attention::find_backend(attention::BackendId::Flash, DeviceKind::CUDA);
  if (!be) throw Error("this CUDA build has no flash backend registered");
  return *be;
}
const attention::Backend& cpu_math() {
  return *attention::find_backend(attention::BackendId::Math, DeviceKind::CPU);
}

Tensor empty_like_shape(const TensorView& t, DType dtype, Device dev) {
  if (t.ndim == 1) return Tensor::empty({t.shape[0]}, dtype, dev);
  if (t.ndim == 2) return Tensor::empty({t.shape[0], t.shape[1]}, dtype, dev);
  if (t.ndim == 3) return Tensor::empty({t.shape[0], t.shape[1], t.shape[2]}, dtype, dev);
  return Tensor::empty({t.shape[0], t.shape[1], t.shape[2], t.shape[3]}, dtype, dev);
}
Tensor to_device(const Tensor& host) {
  Tensor d = empty_like_shape(host, host.dtype(), Device::cuda());
  copy(d, host);
  return d;
}
Tensor to_host(const Tensor& dev) {
  Tensor h = empty_like_shape(dev, dev.dtype(), Device::cpu());
  copy(h, dev);
  return h;
}
// A device tensor filled with NaN (written through a host buffer), so every element must be written.
Tensor poisoned_device(const TensorView& like, DType dtype) {
  Tensor h = empty_like_shape(like, dtype, Device::cpu());
  testing::poison(h);
  return to_device(h);
}
Tensor random_host(const TensorView& like, DType dtype, std::mt19937_64& rng) {
  Tensor h = empty_like_shape(like, dtype, Device::cpu());
  testing::fill_normal(h, rng);
  return h;
}

struct Case {
  DType dtype = DType::BF16;
  int64_t batch = 1, hq = 4, hkv = 4, d = 128, sq = 0, skv = 0;
  MaskType mask = MaskType::None;
  std::vector<int32_t> q_lens, kv_lens;  // packed (THD) when not empty
  bool fp32_accumulate = false;          // o in fp32, gradients added into random fp32 buffers
  bool deterministic = false;
  bool bhsd_q = false;                   // q as a strided [B, S, H, D] view of [B, H, S, D] storage
  bool forward_only = false;             // O and LSE only
};

double tol(DType t) { return t == DType::BF16 ? 1e-2 : 5e-3; }

// Host inputs, their device copies, and the fp64 reference outputs of one case.
struct Problem {
  AttnParams p;
  Tensor q_store, q, k, v, dout;  // host; q may be a strided view of q_store
  TensorView q_view;
  Tensor cu_q, cu_kv;             // host int32
  Tensor o_ref, lse_ref, dq_ref, dk_ref, dv_ref;
};

Problem make_problem(const Case& c, std::mt19937_64& rng) {
  Problem pr;
  const bool packed = !c.q_lens.empty();
  AttnParams& p = pr.p;
  p.device = Device::cpu();
  p.dtype = c.dtype;
  p.heads_q = c.hq;
  p.heads_kv = c.hkv;
  p.head_dim = c.d;
  p.mask = c.mask;
  p.deterministic = c.deterministic;
  if (packed) {
    p.packed = true;
    p.batch = static_cast<int64_t>(c.q_lens.size());
    pr.cu_q = Tensor::empty({p.batch + 1}, DType::I32);
    pr.cu_kv = Tensor::empty({p.batch + 1}, DType::I32);
    int32_t tq = 0, tk = 0;
    pr.cu_q.ptr<int32_t>()[0] = pr.cu_kv.ptr<int32_t>()[0] = 0;
    for (size_t i = 0; i < c.q_lens.size(); ++i) {
      tq += c.q_lens[i];
      tk += c.kv_lens[i];
      pr.cu_q.ptr<int32_t>()[i + 1] = tq;
      pr.cu_kv.ptr<int32_t>()[i + 1] = tk;
      p.seqlen_q = std::max<int64_t>(p.seqlen_q, c.q_lens[i]);
      p.seqlen_kv = std::max<int64_t>(p.seqlen_kv, c.kv_lens[i]);
    }
    pr.q = Tensor::empty({tq, c.hq, c.d}, c.dtype);
    pr.k = Tensor::empty({tk, c.hkv, c.d}, c.dtype);
    pr.dout = Tensor::empty({tq, c.hq, c.d}, c.dtype);
  } else {
    p.batch = c.batch;
    p.seqlen_q = c.sq;
    p.seqlen_kv = c.skv;
    pr.q = Tensor::empty({c.batch, c.sq, c.hq, c.d}, c.dtype);
    pr.k = Tensor::empty({c.batch, c.skv, c.hkv, c.d}, c.dtype);
    pr.dout = Tensor::empty({c.batch, c.sq, c.hq, c.d}, c.dtype);
  }
  pr.v = empty_like_shape(pr.k, c.dtype, Device::cpu());
  for (const Tensor* t : {&pr.q, &pr.k, &pr.v, &pr.dout}) testing::fill_normal(*t, rng);
  pr.q_view = pr.q;
  if (c.bhsd_q) {  // same values, stored [B, H, S, D]
    pr.q_store = Tensor::empty({c.batch, c.hq, c.sq, c.d}, c.dtype);
    TensorView v = pr.q_store.view();
    std::swap(v.shape[1], v.shape[2]);
    std::swap(v.stride[1], v.stride[2]);
    copy(v, pr.q);
    pr.q_view = v;
  }

  // fp64 reference on the same (rounded) inputs.
  pr.o_ref = empty_like_shape(pr.q, DType::F64, Device::cpu());
  pr.lse_ref = packed ? Tensor::empty({c.hq, pr.q.size(0)}, DType::F32)
                      : Tensor::empty({c.batch, c.hq, c.sq}, DType::F32);
  pr.dq_ref = empty_like_shape(pr.q, DType::F64, Device::cpu());
  pr.dk_ref = empty_like_shape(pr.k, DType::F64, Device::cpu());
  pr.dv_ref = empty_like_shape(pr.k, DType::F64, Device::cpu());
  AttnForwardArgs f{pr.q, pr.k, pr.v, pr.o_ref, pr.lse_ref, pr.cu_q, pr.cu_kv};
  cpu_math().forward(p, f);
  if (c.forward_only) return pr;
  AttnBackwardArgs b{pr.q, pr.k, pr.v, pr.o_ref, pr.dout, pr.lse_ref, pr.dq_ref, pr.dk_ref, pr.dv_ref};
  b.cu_seqlens_q = pr.cu_q;
  b.cu_seqlens_kv = pr.cu_kv;
  cpu_math().backward(p, b);
  return pr;
}

struct GpuResult {
  Tensor o, lse, dq, dk, dv;                 // host copies
  Tensor dq_init, dk_init, dv_init;          // host, accumulate mode
};

GpuResult run_gpu(const Case& c, const Problem& pr) {
  AttnParams p = pr.p;
  p.device = Device::cuda();
  const bool packed = p.packed;
  Tensor q_store = to_device(c.bhsd_q ? pr.q_store : pr.q);
  TensorView q = q_store.view();
  if (c.bhsd_q) {
    std::swap(q.shape[1], q.shape[2]);
    std::swap(q.stride[1], q.stride[2]);
  }
  Tensor k = to_device(pr.k), v = to_device(pr.v), dout = to_device(pr.dout);
  Tensor cu_q, cu_kv;
  if (packed) {
    cu_q = to_device(pr.cu_q);
    cu_kv = to_device(pr.cu_kv);
  }
  const DType out = c.fp32_accumulate ? DType::F32 : c.dtype;
  Tensor o = poisoned_device(pr.q, out), lse = poisoned_device(pr.lse_ref, DType::F32);
  AttnForwardArgs f{q, k, v, o, lse, cu_q, cu_kv};
  gpu_flash().forward(p, f);

  GpuResult r;
  if (c.forward_only) {
    synchronize(Device::cuda(0));
    r.o = to_host(o);
    r.lse = to_host(lse);
    return r;
  }
  Tensor dq, dk, dv;
  if (c.fp32_accumulate) {
    std::mt19937_64 rng(testing::fresh_seed());
    r.dq_init = random_host(pr.q, DType::F32, rng);
    r.dk_init = random_host(pr.k, DType::F32, rng);
    r.dv_init = random_host(pr.k, DType::F32, rng);
    dq = to_device(r.dq_init);
    dk = to_device(r.dk_init);
    dv = to_device(r.dv_init);
  } else {
    dq = poisoned_device(pr.q, c.dtype);
    dk = poisoned_device(pr.k, c.dtype);
    dv = poisoned_device(pr.k, c.dtype);
  }
  AttnBackwardArgs b{q, k, v, o, dout, lse, dq, dk, dv};
  b.accumulate = c.fp32_accumulate;
  b.cu_seqlens_q = cu_q;
  b.cu_seqlens_kv = cu_kv;
  gpu_flash().backward(p, b);
  synchronize(Device::cuda(0));
  r.o = to_host(o);
  r.lse = to_host(lse);
  r.dq = to_host(dq);
  r.dk = to_host(dk);
  r.dv = to_host(dv);
  return r;
}

// What the backward added in accumulate mode (got - init), as fp64, so the random initial values cannot hide
// an error in the increment.
Tensor increment(const Tensor& got, const Tensor& init) {
  Tensor e = empty_like_shape(got, DType::F64, Device::cpu());
  copy(e, got);
  for (int64_t i = 0; i < e.numel(); ++i) e.ptr<double>()[i] -= static_cast<double>(init.ptr<float>()[i]);
  return e;
}

void check_case(const Case& c) {
  std::mt19937_64 rng(testing::fresh_seed());
  const Problem pr = make_problem(c, rng);
  const GpuResult r = run_gpu(c, pr);
  const double t = tol(c.dtype);
  const double e_o = rel_error(r.o, pr.o_ref), e_lse = max_abs_error(r.lse, pr.lse_ref);
  if (c.forward_only) {
    std::printf("[%s] rel err O %.2e; LSE max abs %.2e (forward only)\n", pr.p.describe().c_str(), e_o, e_lse);
    EXPECT_LE(e_o, t) << "O";
    EXPECT_LE(e_lse, 1e-3) << "LSE";
    return;
  }
  const bool acc = c.fp32_accumulate;
  const double e_dq = rel_error(acc ? increment(r.dq, r.dq_init) : r.dq, pr.dq_ref);
  const double e_dk = rel_error(acc ? increment(r.dk, r.dk_init) : r.dk, pr.dk_ref);
  const double e_dv = rel_error(acc ? increment(r.dv, r.dv_init) : r.dv, pr.dv_ref);
  std::printf("[%s] rel err O %.2e dQ %.2e dK %.2e dV %.2e; LSE max abs %.2e\n", pr.p.describe().c_str(), e_o, e_dq,
              e_dk, e_dv, e_lse);
  EXPECT_LE(e_o, t) << "O";
  EXPECT_LE(e_lse, 1e-3) << "LSE";
  EXPECT_LE(e_dq, t) << "dQ";
  EXPECT_LE(e_dk, t) << "dK";
  EXPECT_LE(e_dv, t) << "dV";
}

TEST(FlashCuda, Bf16CausalGqaOddLengthStridedQ) {
  RT_REQUIRE_GPU();
  check_case({.batch = 2, .hq = 8, .hkv = 2, .d = 128, .sq = 1000, .skv = 1000, .mask = MaskType::CausalTopLeft,
              .bhsd_q = true});
}

TEST(FlashCuda, Bf16NoMaskLength4097HeadDim64) {
  RT_REQUIRE_GPU();
  check_case({.hq = 4, .hkv = 4, .d = 64, .sq = 4097, .skv = 4097, .mask = MaskType::None});
}

// No mask at head dim 128: key counts on both sides of a tile's end, a sequence of one key and an empty one, GQA.
TEST(FlashCuda, NoMaskHeadDim128PackedAndGqa) {
  RT_REQUIRE_GPU();
  check_case({.batch = 2, .hq = 8, .hkv = 2, .d = 128, .sq = 500, .skv = 1000, .mask = MaskType::None});
  check_case({.dtype = DType::F16, .hq = 4, .hkv = 2, .d = 128, .mask = MaskType::None,
              .q_lens = {60, 177, 1, 0, 300, 129}, .kv_lens = {176, 177, 1, 0, 352, 529}});
}

TEST(FlashCuda, Fp16BottomRightFewerQueries) {
  RT_REQUIRE_GPU();
  check_case({.dtype = DType::F16, .hq = 4, .hkv = 2, .d = 128, .sq = 300, .skv = 1000,
              .mask = MaskType::CausalBottomRight});
}

TEST(FlashCuda, Bf16TopLeftMoreQueries) {
  RT_REQUIRE_GPU();
  check_case({.hq = 2, .hkv = 2, .d = 64, .sq = 1000, .skv = 300, .mask = MaskType::CausalTopLeft});
}

// MQA; Sq > Skv aligned bottom-right: the first 700 rows see no key (LSE -inf, O 0, no gradient).
TEST(FlashCuda, Bf16MqaBottomRightFullyMaskedRows) {
  RT_REQUIRE_GPU();
  check_case({.hq = 2, .hkv = 1, .d = 128, .sq = 1000, .skv = 300, .mask = MaskType::CausalBottomRight});
}

// Packed sequences of odd lengths: at head dim 64 the backward's 128-row query tiles end mid-tile, some with a
// second 64-row half wholly past their sequence.
TEST(FlashCuda, PackedOddLengthsCausalGqa) {
  RT_REQUIRE_GPU();
  for (const int d : {128, 64})
    check_case({.hq = 8, .hkv = 2, .d = d, .mask = MaskType::CausalTopLeft, .q_lens = {1, 129, 647, 300, 77},
                .kv_lens = {1, 129, 647, 300, 77}});
}

TEST(FlashCuda, PackedRaggedBottomRightDeterministic) {
  RT_REQUIRE_GPU();
  check_case({.hq = 4, .hkv = 4, .d = 64, .mask = MaskType::CausalBottomRight, .q_lens = {5, 200, 64, 333},
              .kv_lens = {300, 200, 1000, 100}, .deterministic = true});
}

// The Hopper backward's fast mode on sequences that start off its 64-row dQ tiles, with an empty sequence and one
// whose rows see no key, adding into fp32 gradients.
TEST(FlashCuda, PackedRaggedBottomRightAccumulate) {
  RT_REQUIRE_GPU();
  check_case({.hq = 4, .hkv = 2, .d = 64, .mask = MaskType::CausalBottomRight, .q_lens = {5, 200, 0, 64, 333, 70},
              .kv_lens = {300, 200, 0, 1000, 100, 0}, .fp32_accumulate = true});
}

TEST(FlashCuda, Fp32OutputAndAccumulatedGradients) {
  RT_REQUIRE_GPU();
  check_case({.hq = 4, .hkv = 4, .d = 128, .sq = 777, .skv = 777, .mask = MaskType::CausalTopLeft,
              .fp32_accumulate = true});
  check_case({.hq = 4, .hkv = 2, .d = 64, .sq = 500, .skv = 900, .mask = MaskType::CausalBottomRight,
              .fp32_accumulate = true, .deterministic = true});
}

// Head dim 256, where the backward's two consumers split a 64-key tile by gradient (odd lengths end mid-tile; GQA
// with four query heads per kv head; both causal alignments with rows that see no key; packed ragged documents with
// an empty one; an fp32 O and gradients added into fp32 buffers; fp16).
TEST(FlashCuda, HeadDim256AgainstFp64) {
  RT_REQUIRE_GPU();
  check_case({.hq = 8, .hkv = 2, .d = 256, .sq = 1000, .skv = 1000, .mask = MaskType::CausalTopLeft});
  check_case({.dtype = DType::F16, .hq = 4, .hkv = 4, .d = 256, .sq = 333, .skv = 777, .mask = MaskType::None});
  check_case({.hq = 2, .hkv = 1, .d = 256, .sq = 700, .skv = 300, .mask = MaskType::CausalBottomRight,
              .fp32_accumulate = true});
  check_case({.hq = 4, .hkv = 2, .d = 256, .mask = MaskType::CausalBottomRight, .q_lens = {5, 200, 0, 64, 333},
              .kv_lens = {300, 200, 0, 1000, 100}});
}

// Head dim 192: three 64-column panels, 64-key tiles, the backward's consumers split by gradient with dQ's columns
// split 128 / 64 between them.
TEST(FlashCuda, HeadDim192AgainstFp64) {
  RT_REQUIRE_GPU();
  check_case({.hq = 6, .hkv = 2, .d = 192, .sq = 777, .skv = 777, .mask = MaskType::CausalTopLeft});
  check_case({.dtype = DType::F16, .hq = 2, .hkv = 2, .d = 192, .sq = 300, .skv = 1000,
              .mask = MaskType::CausalBottomRight, .fp32_accumulate = true});
  check_case({.hq = 4, .hkv = 4, .d = 192, .mask = MaskType::None, .q_lens = {65, 1, 0, 400},
              .kv_lens = {130, 64, 0, 333}});
}

// Head dim 256 has the fast backward only: a deterministic one is rejected with the reason (selection passes flash
// over, except under a forward-only scope), and one asked of flash anyway is refused before any kernel runs.
TEST(FlashCuda, HeadDim256DeterministicBackwardIsRefused) {
  RT_REQUIRE_GPU();
  if (cuda_arch(0) != 90) GTEST_SKIP() << "the Hopper flash kernels need sm_90";
  const Case c{.hq = 2, .hkv = 2, .d = 256, .sq = 70, .skv = 70, .mask = MaskType::CausalTopLeft,
               .deterministic = true, .forward_only = true};
  std::mt19937_64 rng(testing::fresh_seed());
  const Problem pr = make_problem(c, rng);
  AttnParams p = pr.p;
  p.device = Device::cuda();
  const std::string reason = "head dim 256 in a deterministic backward";
  EXPECT_TRUE(gpu_flash().unsupported_reasons(p).empty());
  ASSERT_FALSE(gpu_flash().backward_unsupported_reasons(p).empty());
  attention::BackendScope only_flash("flash only", {attention::BackendId::Flash});
  const attention::Selection training = attention::explain(p);
  EXPECT_EQ(training.backend, nullptr) << training.report();
  EXPECT_NE(training.report().find(reason), std::string::npos) << training.report();
  {
    attention::BackendScope scoring = attention::BackendScope::forward_only();
    const attention::Selection s = attention::explain(p);
    EXPECT_EQ(s.backend, &gpu_flash()) << s.report();
    Tensor q = to_device(pr.q), k = to_device(pr.k), v = to_device(pr.v), dout = to_device(pr.dout);
    Tensor o = poisoned_device(pr.q, c.dtype), lse = poisoned_device(pr.lse_ref, DType::F32);
    attention::forward(p, {q, k, v, o, lse});
    synchronize(Device::cuda(0));
    EXPECT_LE(rel_error(to_host(o), pr.o_ref), tol(c.dtype));
    Tensor dq = poisoned_device(pr.q, c.dtype), dk = poisoned_device(pr.k, c.dtype);
    Tensor dv = poisoned_device(pr.k, c.dtype);
    try {
      attention::backward(p, {q, k, v, o, dout, lse, dq, dk, dv});
      ADD_FAILURE() << "a deterministic head-dim-256 backward ran on flash";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << e.what();
    }
  }
  p.deterministic = false;
  EXPECT_TRUE(gpu_flash().backward_unsupported_reasons(p).empty());
  EXPECT_EQ(attention::explain(p).backend, &gpu_flash());
}

// The deterministic backward gives bit-identical gradients on every run, and matches the reference.
TEST(FlashCuda, DeterministicBackwardIsBitwiseRepeatable) {
  RT_REQUIRE_GPU();
  const Case c{.hq = 4, .hkv = 2, .d = 128, .sq = 1000, .skv = 1000, .mask = MaskType::CausalTopLeft,
               .deterministic = true};
  check_case(c);
  std::mt19937_64 rng(testing::fresh_seed());
  const Problem pr = make_problem(c, rng);
  const GpuResult a = run_gpu(c, pr), b = run_gpu(c, pr);
  EXPECT_EQ(std::memcmp(a.dq.data(), b.dq.data(), a.dq.nbytes()), 0) << "dQ differs between runs";
  EXPECT_EQ(std::memcmp(a.dk.data(), b.dk.data(), a.dk.nbytes()), 0) << "dK differs between runs";
  EXPECT_EQ(std::memcmp(a.dv.data(), b.dv.data(), a.dv.nbytes()), 0) << "dV differs between runs";
}

// S = 131072, causal. The reference is computed for three slices of query rows only (those rows with all the keys
// they see, bottom-right aligned); the last slice's keys are seen by the last slice's queries alone, so dK/dV of
// those keys are complete in that slice's reference too.
TEST(FlashCuda, Bf16Causal131072RowSlices) {
  RT_REQUIRE_GPU();
  constexpr int64_t S = 131072, H = 2, D = 128, n = 32;
  std::mt19937_64 rng(testing::fresh_seed());
  Tensor q = Tensor::empty({1, S, H, D}, DType::BF16), k = Tensor::empty({1, S, 1, D}, DType::BF16);
  Tensor v = Tensor::empty({1, S, 1, D}, DType::BF16), dout = Tensor::empty({1, S, H, D}, DType::BF16);
  for (const Tensor* t : {&q, &k, &v, &dout}) testing::fill_normal(*t, rng);
  AttnParams p = attention::params_for(q, k, MaskType::CausalTopLeft);
  p.device = Device::cuda();
  Tensor qd = to_device(q), kd = to_device(k), vd = to_device(v), dod = to_device(dout);
  Tensor o = poisoned_device(q, DType::BF16), lse = poisoned_device(Tensor::empty({1, H, S}, DType::F32), DType::F32);
  Tensor gq = poisoned_device(q, DType::BF16), gk = poisoned_device(k, DType::BF16), gv = poisoned_device(k, DType::BF16);
  gpu_flash().forward(p, {qd, kd, vd, o, lse});
  gpu_flash().backward(p, {qd, kd, vd, o, dod, lse, gq, gk, gv});
  synchronize(Device::cuda(0));
  const Tensor o_h = to_host(o), lse_h = to_host(lse), dq_h = to_host(gq), dk_h = to_host(gk), dv_h = to_host(gv);

  for (int64_t r0 : {int64_t(0), S / 2 - 37, S - n}) {
    const TensorView qs = q.view().slice(1, r0, n), dos = dout.view().slice(1, r0, n);
    const TensorView ks = k.view().slice(1, 0, r0 + n), vs = v.view().slice(1, 0, r0 + n);
    const AttnParams ps = attention::params_for(qs, ks, MaskType::CausalBottomRight);
    Tensor o_ref = Tensor::empty({1, n, H, D}, DType::F64), lse_ref = Tensor::empty({1, H, n}, DType::F32);
    cpu_math().forward(ps, {qs, ks, vs, o_ref, lse_ref});
    Tensor dq_ref = Tensor::empty({1, n, H, D}, DType::F64);
    Tensor dk_ref = Tensor::empty({1, r0 + n, 1, D}, DType::F64), dv_ref = Tensor::empty({1, r0 + n, 1, D}, DType::F64);
    cpu_math().backward(ps, {qs, ks, vs, o_ref, dos, lse_ref, dq_ref, dk_ref, dv_ref});
    const double e_o = rel_error(o_h.view().slice(1, r0, n), o_ref);
    const double e_lse = max_abs_error(lse_h.view().slice(2, r0, n), lse_ref);
    const double e_dq = rel_error(dq_h.view().slice(1, r0, n), dq_ref);
    std::printf("[S=%lld rows %lld..%lld] rel err O %.2e dQ %.2e; LSE max abs %.2e\n", static_cast<long long>(S),
                static_cast<long long>(r0), static_cast<long long>(r0 + n), e_o, e_dq, e_lse);
    EXPECT_LE(e_o, 1e-2) << "O rows " << r0;
    EXPECT_LE(e_lse, 1e-3) << "LSE rows " << r0;
    EXPECT_LE(e_dq, 1e-2) << "dQ rows " << r0;
    if (r0 == S - n) {
      const double e_dk = rel_error(dk_h.view().slice(1, r0, n), dk_ref.view().slice(1, r0, n));
      const double e_dv = rel_error(dv_h.view().slice(1, r0, n), dv_ref.view().slice(1, r0, n));
      std::printf("[S=%lld keys %lld..%lld] rel err dK %.2e dV %.2e\n", static_cast<long long>(S),
                  static_cast<long long>(r0), static_cast<long long>(S), e_dk, e_dv);
      EXPECT_LE(e_dk, 1e-2) << "dK of the last keys";
      EXPECT_LE(e_dv, 1e-2) << "dV of the last keys";
    }
  }
  // Every other gradient element was written and is finite: max_abs_error(x, x) is 0, or inf when x holds a NaN
  // (the poison).
  EXPECT_EQ(max_abs_error(dk_h, dk_h), 0.0) << "dK has NaN or inf";
  EXPECT_EQ(max_abs_error(dv_h, dv_h), 0.0) << "dV has NaN or inf";
  EXPECT_EQ(max_abs_error(dq_h, dq_h), 0.0) << "dQ has NaN or inf";
}

// A packed forward whose K/V tensors hold NaN in the rows after the last sequence: a key tile that reaches past its
// sequence's end must not let them in (0 * NaN is NaN in P V), on both the sequence-end tiles of each head dim (at
// 128 also without a mask, where no causal limit hides the keys past the end).
TEST(FlashCuda, PackedForwardIgnoresNanRowsPastTheSequences) {
  RT_REQUIRE_GPU();
  const std::pair<int64_t, MaskType> cases[] = {{64, MaskType::CausalBottomRight}, {128, MaskType::CausalBottomRight},
                                                {128, MaskType::None}, {192, MaskType::CausalBottomRight},
                                                {256, MaskType::CausalBottomRight}};
  for (const auto& [d, mask] : cases) {
    const Case c{.hq = 4, .hkv = 2, .d = d, .mask = mask, .q_lens = {200, 77}, .kv_lens = {300, 129},
                 .forward_only = true};
    std::mt19937_64 rng(testing::fresh_seed());
    const Problem pr = make_problem(c, rng);
    AttnParams p = pr.p;
    p.device = Device::cuda();
    const int64_t tk = pr.k.size(0), pad = 200;
    Tensor k_host = Tensor::empty({tk + pad, c.hkv, d}, c.dtype), v_host = Tensor::empty({tk + pad, c.hkv, d}, c.dtype);
    testing::poison(k_host);
    testing::poison(v_host);
    copy(k_host.view().slice(0, 0, tk), pr.k);
    copy(v_host.view().slice(0, 0, tk), pr.v);
    Tensor q = to_device(pr.q), k = to_device(k_host), v = to_device(v_host);
    Tensor cu_q = to_device(pr.cu_q), cu_kv = to_device(pr.cu_kv);
    Tensor o = poisoned_device(pr.q, c.dtype), lse = poisoned_device(pr.lse_ref, DType::F32);
    gpu_flash().forward(p, {q, k, v, o, lse, cu_q, cu_kv});
    synchronize(Device::cuda(0));
    const double e_o = rel_error(to_host(o), pr.o_ref), e_lse = max_abs_error(to_host(lse), pr.lse_ref);
    std::printf("[%s, %lld NaN rows after the keys] rel err O %.2e; LSE max abs %.2e\n", p.describe().c_str(),
                static_cast<long long>(pad), e_o, e_lse);
    EXPECT_LE(e_o, tol(c.dtype)) << "O, D=" << d;
    EXPECT_LE(e_lse, 1e-3) << "LSE, D=" << d;
  }
}

TEST(FlashCuda, UnsupportedReasonsNameEachRequirement) {
  RT_REQUIRE_GPU();
  AttnParams p;
  p.device = Device::cuda();
  p.dtype = DType::F32;
  p.head_dim = 96;
  p.seqlen_q = p.seqlen_kv = 128;
  std::string all;
  for (const std::string& r : gpu_flash().unsupported_reasons(p)) all += r + "; ";
  EXPECT_NE(all.find("dtype fp32"), std::string::npos) << all;
  EXPECT_NE(all.find("head dim 96"), std::string::npos) << all;
  p.dtype = DType::BF16;
  p.head_dim = 128;
  EXPECT_TRUE(gpu_flash().unsupported_reasons(p).empty() || cuda_arch(0) != 90);
  EXPECT_TRUE(gpu_flash().cp_capable());  // declared after tests/cp_gpu passed on two H200s
}

}  // namespace
}  // namespace ringtrain
