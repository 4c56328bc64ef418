// The `cudnn` backend against the GPU math backend (fp32, itself checked against the fp64 CPU reference in
// cuda_math_test.cpp) and, on a small case, directly against the fp64 CPU reference. Fresh random inputs,
// NaN-poisoned outputs.
//
// Tolerances (relative L2 error): 1e-2 for bf16 (fp16: 5e-3). cuDNN rounds P and dS to the input dtype before
// its tensor-core products and stores O and the gradients in it (bf16: 2^-9 relative per element), so errors
// of a few 1e-3 are expected (seen on H200 with cuDNN 9.19: bf16 2e-3 to 3e-3, fp16 3e-4 to 4e-4; printed).
// LSE comes from fp32 scores of the same rounded inputs: max abs 1e-4 (seen: <= 2e-6 for |LSE| < 20).
#include "gpu_attention_harness.h"

namespace ringtrain {
namespace {

using attention::BackendId;
using attention::MaskType;
using namespace testing::gpu;

const attention::Backend* cudnn_or_skip_reason(std::string& why) {
  const attention::Backend* be = attention::find_backend(BackendId::Cudnn, DeviceKind::CUDA);
  if (!be) why = "this build has no cudnn backend (cuDNN frontend headers not found at configure time)";
  return be;
}

#define RT_REQUIRE_CUDNN(be)                        \
  RT_REQUIRE_GPU();                                 \
  std::string why_;                                 \
  const attention::Backend* be = cudnn_or_skip_reason(why_); \
  if (!be) GTEST_SKIP() << why_;

void check_cudnn(const attention::Backend& be, const Case& c, double tol, const char* what, bool against_cpu = false,
                 bool via_selection = false) {
  std::mt19937_64 rng(testing::fresh_seed());
  const Problem pr = make_problem(c, rng);
  attention::AttnParams gp = pr.p;
  gp.device = Device::cuda();
  const auto reasons = be.unsupported_reasons(gp);
  ASSERT_TRUE(reasons.empty()) << reasons.front();
  const Result got = run_gpu(be, c, pr, via_selection);
  Case ref_case = c;
  ref_case.out_dtype = DType::F32;
  ref_case.bhsd_dout = false;
  const Result ref = against_cpu ? run_cpu(cpu_math(), c, pr) : run_gpu(*gpu_backend(BackendId::Math), ref_case, pr);
  const Errors e = compare(got, ref);
  e.print(what);
  expect_within(e, tol, 1e-4);
}

TEST(Cudnn, MatchesCpuReferenceSmall) {
  RT_REQUIRE_CUDNN(be);
  Case c;
  c.batch = 2, c.hq = 4, c.hkv = 2, c.d = 64, c.sq = 1000, c.skv = 1000;
  c.mask = MaskType::CausalTopLeft;
  check_cudnn(*be, c, 1e-2, "cudnn vs cpu fp64: bf16 causal B=2 GQA 4/2 S=1000", /*against_cpu=*/true);
}

TEST(Cudnn, Gqa32x8Length4097Causal) {
  RT_REQUIRE_CUDNN(be);
  Case c;
  c.hq = 32, c.hkv = 8, c.d = 128, c.sq = 4097, c.skv = 4097;
  c.mask = MaskType::CausalTopLeft;
  check_cudnn(*be, c, 1e-2, "cudnn vs gpu math: bf16 causal GQA 32/8 S=4097");
}

TEST(Cudnn, MqaCrossLengthsNoMaskFp16) {
  RT_REQUIRE_CUDNN(be);
  Case c;
  c.dtype = c.out_dtype = DType::F16;
  c.batch = 2, c.hq = 8, c.hkv = 1, c.d = 64, c.sq = 1000, c.skv = 4097;
  check_cudnn(*be, c, 5e-3, "cudnn vs gpu math: fp16 MQA 8/1 Sq=1000 Skv=4097");
}

TEST(Cudnn, BottomRightSqLessThanSkv) {
  RT_REQUIRE_CUDNN(be);
  Case c;
  c.hq = 4, c.hkv = 4, c.d = 128, c.sq = 512, c.skv = 1024;
  c.mask = MaskType::CausalBottomRight;
  check_cudnn(*be, c, 1e-2, "cudnn vs gpu math: bottom-right Sq=512 Skv=1024");
}

TEST(Cudnn, HeadDim256) {
  RT_REQUIRE_CUDNN(be);
  Case c;
  c.hq = 4, c.hkv = 2, c.d = 256, c.sq = 1000, c.skv = 1000;
  c.mask = MaskType::CausalTopLeft;
  check_cudnn(*be, c, 1e-2, "cudnn vs gpu math: D=256 causal");
}

TEST(Cudnn, PackedOddLengthsGqa) {
  RT_REQUIRE_CUDNN(be);
  Case c;
  c.hq = 8, c.hkv = 2, c.d = 128;
  c.q_lens = {1, 77, 513, 1000, 31};
  c.kv_lens = {1, 77, 513, 1000, 31};
  c.mask = MaskType::CausalTopLeft;
  check_cudnn(*be, c, 1e-2, "cudnn vs gpu math: packed odd lengths causal GQA 8/2");
}

// The crash this project started from: cuDNN's backward needs dO with O's strides. Here dO is a BHSD-strided
// view while O is contiguous BSHD; the backend must copy it, and the gradients must still be right.
TEST(Cudnn, DoutWithOtherStridesThanO) {
  RT_REQUIRE_CUDNN(be);
  Case c;
  c.batch = 2, c.hq = 8, c.hkv = 8, c.d = 128, c.sq = 1000, c.skv = 1000;
  c.mask = MaskType::CausalTopLeft;
  c.bhsd_dout = true;
  check_cudnn(*be, c, 1e-2, "cudnn vs gpu math: dO strides != O strides");
}

// CP partials: O in fp32 from bf16 inputs, gradients accumulated into fp32.
TEST(Cudnn, Fp32OutputAndAccumulate) {
  RT_REQUIRE_CUDNN(be);
  Case c;
  c.hq = 8, c.hkv = 4, c.d = 128, c.sq = 1000, c.skv = 1000;
  c.out_dtype = DType::F32;
  c.accumulate = true;
  c.mask = MaskType::CausalTopLeft;
  check_cudnn(*be, c, 1e-2, "cudnn vs gpu math: fp32 O, accumulate");
}

// Through the one selection point: an allow-list of cudnn alone dispatches to it.
TEST(Cudnn, RunsThroughSelection) {
  RT_REQUIRE_CUDNN(be);
  attention::BackendScope scope("test: cudnn only", {BackendId::Cudnn});
  attention::reset_dispatch_counts();
  Case c;
  c.hq = 8, c.hkv = 2, c.d = 128, c.sq = 640, c.skv = 640;
  c.mask = MaskType::CausalTopLeft;
  check_cudnn(*be, c, 1e-2, "cudnn through attention::forward/backward", false, /*via_selection=*/true);
  const auto counts = attention::dispatch_counts();
  EXPECT_EQ(counts.forward[static_cast<int>(BackendId::Cudnn)], 1);
  EXPECT_EQ(counts.backward[static_cast<int>(BackendId::Cudnn)], 1);
}

TEST(Cudnn, StatesWhatItCannotServe) {
  RT_REQUIRE_CUDNN(be);
  attention::AttnParams p;
  p.device = Device::cuda();
  p.dtype = DType::BF16;
  p.heads_q = p.heads_kv = 4;
  p.head_dim = 128;
  p.seqlen_q = p.seqlen_kv = 4096;
  const auto ok = be->unsupported_reasons(p);
  ASSERT_TRUE(ok.empty()) << ok.front();  // also fails when libcudnn.so.9 cannot be loaded, with the dlopen error
  auto has = [&](const attention::AttnParams& q, const char* text) {
    const auto r = be->unsupported_reasons(q);
    for (const auto& s : r)
      if (s.find(text) != std::string::npos) return true;
    return false;
  };
  attention::AttnParams q = p;
  q.dtype = DType::F32;
  EXPECT_TRUE(has(q, "bf16 or fp16"));
  q = p;
  q.head_dim = 100;
  EXPECT_TRUE(has(q, "head dim 100"));
  q = p;
  q.mask = MaskType::CausalBottomRight;
  q.seqlen_q = 1000;
  EXPECT_TRUE(has(q, "multiples of 64"));
  q.seqlen_q = 8192;
  EXPECT_TRUE(has(q, "Sq > Skv"));
}

}  // namespace
}  // namespace ringtrain
