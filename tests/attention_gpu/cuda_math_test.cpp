// The GPU `math` backend against the fp64 CPU math reference on fresh random inputs with NaN-poisoned outputs.
//
// Tolerances (relative L2 error): the GPU math backend computes in true fp32 (cuBLASLt without TF32, fp32
// softmax) on the same dtype-rounded inputs as the reference, so with fp32 outputs it agrees to fp32 rounding
// accumulated over sums of up to a few thousand terms: 1e-5 (seen on H200: 5e-8 to 1.3e-6, printed). With
// 16-bit outputs the storage rounding dominates (bf16: 2^-9 relative per element; seen 1.6e-3 to 1.8e-3): 1e-2.
// LSE is fp32 either way: max abs 1e-4 (|LSE| < 20 here, fp32 relative rounding ~1e-7 per step; seen <= 1e-6).
#include <limits>

#include "gpu_attention_harness.h"

namespace ringtrain {
namespace {

using attention::BackendId;
using attention::MaskType;
using namespace testing::gpu;

void check_math(const Case& c, double tol, const char* what) {
  RT_REQUIRE_GPU();
  const attention::Backend* be = gpu_backend(BackendId::Math);
  ASSERT_NE(be, nullptr);
  std::mt19937_64 rng(testing::fresh_seed());
  const Problem pr = make_problem(c, rng);
  attention::AttnParams gp = pr.p;
  gp.device = Device::cuda();
  const auto reasons = be->unsupported_reasons(gp);
  ASSERT_TRUE(reasons.empty()) << reasons.front();
  const Result got = run_gpu(*be, c, pr);
  const Result ref = run_cpu(cpu_math(), c, pr);
  const Errors e = compare(got, ref);
  e.print(what);
  expect_within(e, tol, 1e-4);
}

TEST(CudaMath, Fp32CausalGqaMatchesCpu) {
  Case c;
  c.dtype = c.out_dtype = DType::F32;
  c.batch = 2, c.hq = 4, c.hkv = 2, c.d = 64, c.sq = 1000, c.skv = 1000;
  c.mask = MaskType::CausalTopLeft;
  check_math(c, 1e-5, "fp32 causal B=2 GQA 4/2 S=1000");
}

TEST(CudaMath, Bf16Gqa32x8Length1000) {
  Case c;
  c.dtype = c.out_dtype = DType::BF16;
  c.hq = 32, c.hkv = 8, c.d = 128, c.sq = 1000, c.skv = 1000;
  c.mask = MaskType::CausalTopLeft;
  check_math(c, 1e-2, "bf16 causal GQA 32/8 S=1000 bf16 outputs");
}

TEST(CudaMath, Bf16InputsFp32OutputsAreFp32Exact) {
  Case c;
  c.dtype = DType::BF16;
  c.out_dtype = DType::F32;
  c.hq = 8, c.hkv = 2, c.d = 128, c.sq = 1000, c.skv = 1000;
  c.mask = MaskType::None;
  check_math(c, 1e-5, "bf16 inputs fp32 outputs no mask GQA 8/2 S=1000");
}

// Sq > Skv with the bottom-right alignment: the first Sq - Skv rows see no key (LSE = -inf, O = 0, no gradient).
TEST(CudaMath, Fp16MqaBottomRight4097WithEmptyRows) {
  Case c;
  c.dtype = DType::F16;
  c.out_dtype = DType::F32;
  c.hq = 2, c.hkv = 1, c.d = 64, c.sq = 4097, c.skv = 3001;
  c.mask = MaskType::CausalBottomRight;
  check_math(c, 1e-5, "fp16 MQA 2/1 bottom-right Sq=4097 Skv=3001");
}

TEST(CudaMath, TopLeftSqLessThanSkvMqa) {
  Case c;
  c.dtype = c.out_dtype = DType::F32;
  c.hq = 8, c.hkv = 1, c.d = 96, c.sq = 333, c.skv = 1000;
  c.mask = MaskType::CausalTopLeft;
  check_math(c, 1e-5, "fp32 MQA 8/1 top-left Sq=333 Skv=1000");
}

TEST(CudaMath, PackedOddLengthsAccumulate) {
  Case c;
  c.dtype = DType::BF16;
  c.out_dtype = DType::F32;
  c.hq = 8, c.hkv = 2, c.d = 64;
  c.q_lens = {1, 77, 513, 1000, 0, 31};
  c.kv_lens = {1, 77, 513, 1000, 0, 31};
  c.mask = MaskType::CausalTopLeft;
  c.accumulate = true;
  check_math(c, 1e-5, "packed odd lengths causal GQA 8/2 accumulate");
}

TEST(CudaMath, PackedCrossLengthsNoMask) {
  Case c;
  c.dtype = DType::F32;
  c.out_dtype = DType::F32;
  c.hq = 4, c.hkv = 4, c.d = 32;
  c.q_lens = {5, 300, 129};
  c.kv_lens = {17, 100, 1000};
  check_math(c, 1e-5, "packed Sq != Skv per sequence, no mask");
}

// An fp32 bias [1, Hq, Sq, Skv] with -inf entries and one fully hidden row (LSE -inf, O 0, no gradient) under the
// bottom-right mask, against the fp64 CPU reference (same tolerances: fp32 outputs).
TEST(CudaMath, BiasWithHiddenEntriesMatchesCpu) {
  RT_REQUIRE_GPU();
  const attention::Backend* be = gpu_backend(BackendId::Math);
  ASSERT_NE(be, nullptr);
  Case c;
  c.dtype = c.out_dtype = DType::F32;
  c.batch = 2, c.hq = 4, c.hkv = 2, c.d = 64, c.sq = 300, c.skv = 333;
  c.mask = MaskType::CausalBottomRight;
  std::mt19937_64 rng(testing::fresh_seed());
  Problem pr = make_problem(c, rng);
  pr.p.has_bias = true;
  pr.bias = host_tensor({1, c.hq, c.sq, c.skv}, DType::F32);
  testing::fill_normal(pr.bias, rng);
  std::uniform_int_distribution<int> pick(0, 9);
  for (int64_t i = 0; i < pr.bias.numel(); ++i)
    if (pick(rng) == 0 || (i / c.skv) % c.sq == 7) pr.bias.ptr<float>()[i] = -std::numeric_limits<float>::infinity();
  const Errors e = compare(run_gpu(*be, c, pr), run_cpu(cpu_math(), c, pr));
  e.print("fp32 bias [1,H,Sq,Skv] with -inf entries and a hidden row, bottom-right");
  expect_within(e, 1e-5, 1e-4);
}

TEST(CudaMath, StatesItsLimits) {
  RT_REQUIRE_GPU();
  const attention::Backend* be = gpu_backend(BackendId::Math);
  ASSERT_NE(be, nullptr);
  attention::AttnParams p;
  p.device = Device::cuda();
  p.dtype = DType::BF16;
  p.heads_q = p.heads_kv = 4;
  p.head_dim = 128;
  p.seqlen_q = p.seqlen_kv = 32768;
  EXPECT_TRUE(be->unsupported_reasons(p).empty());
  p.seqlen_kv = 32769;
  auto r = be->unsupported_reasons(p);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_NE(r[0].find("2^30"), std::string::npos) << r[0];
  p.seqlen_kv = 100;
  p.dtype = DType::F64;
  r = be->unsupported_reasons(p);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_NE(r[0].find("fp64"), std::string::npos) << r[0];
}

}  // namespace
}  // namespace ringtrain
