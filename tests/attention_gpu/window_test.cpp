// Sliding-window attention (AttnParams::window) on the GPU backends against the fp64 CPU math backend without a
// window, the window encoded as a dense additive -inf bias from Hugging Face's rule (key j visible to the query at
// position i when j <= i and i - j < w), on fresh random inputs with NaN-poisoned outputs: O, LSE, dQ, dK, dV.
// Packed calls (which take no bias) are checked against the CPU math backend's own window, itself checked against the
// bias reference in tests/attention/window_test.cpp.
//
// Covered: efficient's tensor-core kernels (flash_fwd.cu, flash_bwd.cu fast and deterministic) and SIMT kernels (fp32,
// D = 256), the GPU math backend, cudnn (top-left causal, Sq <= Skv: what its sliding window takes; the rest is
// declined with a reason, checked from the params alone), and flash (the Hopper forward and backward at head dims
// 64, 128, 192 and 256, and flash_bwd.cu in deterministic mode). Windows of one key, inside a tile, across tile boundaries
// and longer than the sequence; both causal alignments with Sq != Skv, including rows that see no key.
//
// Tolerances as in efficient_test.cpp / cuda_math_test.cpp (relative L2 error against fp64 on the same rounded
// inputs): bf16 1e-2, fp16 5e-3, fp32 1e-5; LSE max abs 1e-3 for 16-bit inputs, 1e-4 for fp32.
#include <limits>

#include "gpu_attention_harness.h"
#include "window_reference.h"

namespace ringtrain {
namespace {

using testing::hf_visible;
using testing::window_bias;

using attention::BackendId;
using attention::MaskType;
using namespace testing::gpu;

double tol_of(DType t) { return t == DType::F32 ? 1e-5 : t == DType::F16 ? 5e-3 : 1e-2; }
double lse_tol_of(DType t) { return t == DType::F32 ? 1e-4 : 1e-3; }

void check(BackendId id, const Case& c, int64_t window, bool deterministic, const char* what) {
  RT_REQUIRE_GPU();
  if (id == BackendId::Cudnn && !attention::find_backend(id, DeviceKind::CUDA))
    GTEST_SKIP() << "this build has no cudnn backend (cuDNN frontend headers not found at configure time)";
  const attention::Backend* be = gpu_backend(id);
  ASSERT_NE(be, nullptr);
  std::mt19937_64 rng(testing::fresh_seed());
  Problem pr = make_problem(c, rng);
  pr.p.window = window;
  pr.p.deterministic = deterministic;
  attention::AttnParams gp = pr.p;
  gp.device = Device::cuda();
  const auto reasons = be->unsupported_reasons(gp);
  ASSERT_TRUE(reasons.empty()) << reasons.front();
  const Result got = run_gpu(*be, c, pr);
  Problem ref = pr;
  if (!c.packed()) {
    ref.p.window = 0;
    ref.p.has_bias = true;
    ref.bias = window_bias(c.mask, window, c.sq, c.skv);
  }
  const Errors e = compare(got, run_cpu(cpu_math(), c, ref));
  e.print(what);
  expect_within(e, tol_of(c.dtype), lse_tol_of(c.dtype));
}

Case dense(DType dtype, int64_t d, int64_t sq, int64_t skv, MaskType mask, int64_t hq = 4, int64_t hkv = 2) {
  Case c;
  c.dtype = c.out_dtype = dtype;
  c.hq = hq, c.hkv = hkv, c.d = d, c.sq = sq, c.skv = skv, c.mask = mask;
  return c;
}

Case packed(DType dtype, int64_t d, std::vector<int32_t> lens) {
  Case c = dense(dtype, d, 0, 0, MaskType::CausalTopLeft);
  c.q_lens = c.kv_lens = std::move(lens);
  return c;
}

// --- efficient: tensor-core kernels (bf16/fp16, D <= 128) --------------------------------------------------------

TEST(WindowEfficientCuda, Bf16OneKey) {
  check(BackendId::Efficient, dense(DType::BF16, 64, 300, 300, MaskType::CausalTopLeft), 1, false, "eff bf16 w=1");
}

TEST(WindowEfficientCuda, Bf16InsideATile) {
  check(BackendId::Efficient, dense(DType::BF16, 64, 517, 517, MaskType::CausalTopLeft), 37, false, "eff bf16 w=37");
}

TEST(WindowEfficientCuda, Bf16AcrossTiles) {
  check(BackendId::Efficient, dense(DType::BF16, 128, 700, 700, MaskType::CausalTopLeft, 8, 2), 200, false,
        "eff bf16 D=128 GQA w=200");
}

TEST(WindowEfficientCuda, Bf16LongerThanTheSequence) {
  check(BackendId::Efficient, dense(DType::BF16, 64, 300, 300, MaskType::CausalTopLeft), 1000, false,
        "eff bf16 w=1000 > S");
}

TEST(WindowEfficientCuda, Fp16BottomRightSqBelowSkv) {
  check(BackendId::Efficient, dense(DType::F16, 128, 200, 517, MaskType::CausalBottomRight), 100, false,
        "eff fp16 bottom-right 200x517 w=100");
}

TEST(WindowEfficientCuda, Bf16BottomRightRowsThatSeeNothing) {
  check(BackendId::Efficient, dense(DType::BF16, 64, 517, 200, MaskType::CausalBottomRight), 50, false,
        "eff bf16 bottom-right 517x200 w=50");
}

TEST(WindowEfficientCuda, Bf16TopLeftSqAboveSkv) {
  check(BackendId::Efficient, dense(DType::BF16, 64, 400, 150, MaskType::CausalTopLeft), 90, false,
        "eff bf16 top-left 400x150 w=90");
}

TEST(WindowEfficientCuda, Bf16Deterministic) {
  check(BackendId::Efficient, dense(DType::BF16, 128, 450, 450, MaskType::CausalTopLeft), 90, true,
        "eff bf16 deterministic w=90");
}

TEST(WindowEfficientCuda, Bf16Packed) {
  check(BackendId::Efficient, packed(DType::BF16, 64, {300, 1, 150, 77}), 64, false, "eff bf16 packed w=64");
}

// --- efficient: SIMT kernels (fp32, D > 128) ----------------------------------------------------------------------

TEST(WindowEfficientCuda, Fp32Simt) {
  check(BackendId::Efficient, dense(DType::F32, 64, 300, 300, MaskType::CausalTopLeft), 45, false, "eff fp32 w=45");
}

TEST(WindowEfficientCuda, Bf16D256SimtBottomRight) {
  check(BackendId::Efficient, dense(DType::BF16, 256, 150, 260, MaskType::CausalBottomRight), 70, false,
        "eff bf16 D=256 bottom-right w=70");
}

TEST(WindowEfficientCuda, Fp32SimtPacked) {
  check(BackendId::Efficient, packed(DType::F32, 32, {100, 33, 64}), 20, false, "eff fp32 packed w=20");
}

// --- math -----------------------------------------------------------------------------------------------------------

TEST(WindowMathCuda, Fp32TopLeft) {
  Case c = dense(DType::F32, 64, 300, 300, MaskType::CausalTopLeft);
  check(BackendId::Math, c, 37, false, "math fp32 w=37");
}

TEST(WindowMathCuda, Fp32BottomRight) {
  Case c = dense(DType::F32, 32, 100, 300, MaskType::CausalBottomRight);
  check(BackendId::Math, c, 64, false, "math fp32 bottom-right 100x300 w=64");
}

// --- cudnn ----------------------------------------------------------------------------------------------------------

TEST(WindowCudnnCuda, Bf16TopLeft) {
  check(BackendId::Cudnn, dense(DType::BF16, 128, 512, 512, MaskType::CausalTopLeft, 8, 2), 100, false,
        "cudnn bf16 w=100");
}

TEST(WindowCudnnCuda, Fp16TopLeftSqBelowSkvOddLengths) {
  check(BackendId::Cudnn, dense(DType::F16, 64, 200, 333, MaskType::CausalTopLeft), 45, false,
        "cudnn fp16 top-left 200x333 w=45");
}

TEST(WindowCudnnCuda, Bf16BottomRightSquareIsTopLeft) {
  check(BackendId::Cudnn, dense(DType::BF16, 64, 300, 300, MaskType::CausalBottomRight), 1, true,
        "cudnn bf16 bottom-right square w=1 deterministic");
}

// What cuDNN's sliding window does not take is declined naming the window (from the params: no GPU needed).
TEST(WindowCudnnCuda, DeclinesWhatItsWindowExcludes) {
  const attention::Backend* be = attention::find_backend(BackendId::Cudnn, DeviceKind::CUDA);
  if (!be) GTEST_SKIP() << "this build has no cudnn backend (cuDNN frontend headers not found at configure time)";
  attention::AttnParams p;
  p.device = Device::cuda(), p.dtype = DType::BF16, p.heads_q = 8, p.heads_kv = 2, p.head_dim = 128, p.window = 64;
  const auto names = [&](const char* what) {
    for (const std::string& r : be->unsupported_reasons(p))
      if (r.find("sliding window 64") != std::string::npos && r.find(what) != std::string::npos) return true;
    return false;
  };
  p.mask = MaskType::CausalBottomRight, p.seqlen_q = 128, p.seqlen_kv = 256;
  EXPECT_TRUE(names("top-left"));
  p.mask = MaskType::CausalTopLeft, p.seqlen_q = 256, p.seqlen_kv = 128;
  EXPECT_TRUE(names("Sq <= Skv"));
  p.seqlen_q = p.seqlen_kv = 256, p.packed = true;
  EXPECT_TRUE(names("packed"));
}

// --- flash -----------------------------------------------------------------------------------------------------------

TEST(WindowFlashCuda, Bf16HopperBackward) {
  check(BackendId::Flash, dense(DType::BF16, 128, 700, 700, MaskType::CausalTopLeft, 8, 2), 200, false,
        "flash bf16 w=200");
}

TEST(WindowFlashCuda, Fp16D64BottomRight) {
  check(BackendId::Flash, dense(DType::F16, 64, 300, 517, MaskType::CausalBottomRight), 77, false,
        "flash fp16 bottom-right w=77");
}

TEST(WindowFlashCuda, Bf16Deterministic) {
  check(BackendId::Flash, dense(DType::BF16, 64, 450, 450, MaskType::CausalTopLeft), 90, true,
        "flash bf16 deterministic w=90");
}

// A window far shorter than the sequence: the forward skips the key tiles wholly before a query tile's windows.
TEST(WindowFlashCuda, Bf16LongSequenceShortWindow) {
  check(BackendId::Flash, dense(DType::BF16, 128, 2000, 2000, MaskType::CausalTopLeft, 4, 2), 130, false,
        "flash bf16 S=2000 w=130");
  check(BackendId::Flash, dense(DType::BF16, 64, 600, 600, MaskType::CausalTopLeft), 1, false, "flash bf16 w=1");
}

// Head dims 192 and 256 (64-key tiles, consumers split by gradient): windows inside a key tile and across several,
// bottom-right with Sq < Skv.
TEST(WindowFlashCuda, Bf16D192AndD256) {
  check(BackendId::Flash, dense(DType::BF16, 256, 500, 500, MaskType::CausalTopLeft, 4, 2), 40, false,
        "flash bf16 D=256 w=40");
  check(BackendId::Flash, dense(DType::BF16, 256, 300, 517, MaskType::CausalBottomRight), 150, false,
        "flash bf16 D=256 bottom-right w=150");
  check(BackendId::Flash, dense(DType::BF16, 192, 450, 450, MaskType::CausalTopLeft, 4, 2), 100, false,
        "flash bf16 D=192 w=100");
}

TEST(WindowFlashCuda, Bf16Packed) {
  check(BackendId::Flash, packed(DType::BF16, 128, {300, 1, 150, 77}), 64, false, "flash bf16 packed w=64");
}

}  // namespace
}  // namespace ringtrain
