// The CUDA `decode` backend (KV-cache calls: a few query rows per sequence against a padded cache with per-sequence
// used lengths) against an fp64 reference written here, on fresh random bf16/fp16 inputs with NaN-poisoned outputs:
// ragged used lengths (0, 1, tile edges, the whole capacity), head dims 16 to 128, GQA groups of 4 and 7, MQA, no GQA,
// Sq = 1 to 3 (rows that see no key), both masks a cache call takes, caches of one split and of several (merged
// partial results).
// Calls go through the selection, which must pick decode and give every other backend's reason.
//
// Tolerances, on the same dtype-rounded inputs: O is a convex combination of values computed in fp32 (scores and
// P V in fp32, no rounding of P), then stored in the dtype: one rounding of 2^-9 (bf16) relative, so
// |O - ref| <= 2e-3 + 2^-8 |ref| leaves fp32 accumulation over <= 5000 keys (~1e-6) a wide margin. LSE is fp32
// arithmetic (exp2/log2 of fp32 scores): 1e-3 absolute; rows that see no key must be -inf exactly, with O = 0.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gpu_attention_harness.h"

namespace ringtrain {
namespace {

using attention::BackendId;
using attention::MaskType;
using namespace testing::gpu;

struct DecodeCase {
  int64_t hq, hkv, d, sq, capacity;
  std::vector<int32_t> used;
  DType dtype = DType::BF16;
  MaskType mask = MaskType::CausalBottomRight;
};

attention::AttnParams params_of(const DecodeCase& c) {
  attention::AttnParams p;
  p.device = Device::cuda();
  p.dtype = c.dtype;
  p.batch = static_cast<int64_t>(c.used.size());
  p.heads_q = c.hq, p.heads_kv = c.hkv, p.head_dim = c.d;
  p.seqlen_q = c.sq, p.seqlen_kv = c.capacity;
  p.mask = c.mask;
  p.kv_cache = true;
  return p;
}

void run_case(const DecodeCase& c) {
  std::mt19937_64 rng(testing::fresh_seed());
  const attention::AttnParams p = params_of(c);
  const int64_t B = p.batch, Sq = c.sq, Hq = c.hq, Hkv = c.hkv, D = c.d, C = c.capacity;
  const Tensor q = host_tensor({B, Sq, Hq, D}, c.dtype), k = host_tensor({B, C, Hkv, D}, c.dtype),
               v = host_tensor({B, C, Hkv, D}, c.dtype);
  for (const Tensor* t : {&q, &k, &v}) testing::fill_normal(*t, rng);
  Tensor used = Tensor::empty({B}, DType::I32);
  for (int64_t b = 0; b < B; ++b) used.ptr<int32_t>()[b] = c.used[static_cast<size_t>(b)];

  const Tensor dq = upload(q), dk = upload(k), dv = upload(v), dused = upload(used);
  const Tensor o = poisoned_device({B, Sq, Hq, D}, c.dtype), lse = poisoned_device({B, Hq, Sq}, DType::F32);
  attention::AttnForwardArgs a;
  a.q = dq, a.k = dk, a.v = dv, a.o = o, a.lse = lse, a.kv_used = dused;
  const attention::Selection s = attention::explain(p);
  ASSERT_NE(s.backend, nullptr) << s.report();
  EXPECT_EQ(s.backend->id(), BackendId::Decode) << s.report();
  for (const attention::CandidateReport& r : s.candidates) {
    if (r.id == BackendId::Decode || !attention::find_backend(r.id, DeviceKind::CUDA)) continue;
    bool named = false;
    for (const std::string& why : r.reasons) named |= why == attention::kv_cache_reason();
    EXPECT_TRUE(named) << attention::backend_name(r.id) << " does not give the KV-cache reason\n" << s.report();
  }
  const attention::DispatchCounts before = attention::dispatch_counts();
  attention::forward(p, a);
  EXPECT_EQ(attention::dispatch_counts().forward[static_cast<int>(BackendId::Decode)],
            before.forward[static_cast<int>(BackendId::Decode)] + 1);
  const Tensor ho = download(o), hl = download(lse);

  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  double worst_o = 0, worst_lse = 0;
  std::vector<double> score(static_cast<size_t>(C)), ref(static_cast<size_t>(D));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < Sq; ++i)
      for (int64_t h = 0; h < Hq; ++h) {
        const int64_t g = h / (Hq / Hkv), n_used = c.used[static_cast<size_t>(b)];
        const int64_t limit =
            std::clamp<int64_t>(c.mask == MaskType::None ? n_used : n_used - Sq + i + 1, 0, n_used);
        double m = -std::numeric_limits<double>::infinity(), sum = 0;
        for (int64_t j = 0; j < limit; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < D; ++e)
            dot += load_as_double(q.data(), c.dtype, ((b * Sq + i) * Hq + h) * D + e) *
                   load_as_double(k.data(), c.dtype, ((b * C + j) * Hkv + g) * D + e);
          score[static_cast<size_t>(j)] = dot * scale;
          m = std::max(m, dot * scale);
        }
        std::fill(ref.begin(), ref.end(), 0.0);
        for (int64_t j = 0; j < limit; ++j) {
          const double w = std::exp(score[static_cast<size_t>(j)] - m);
          sum += w;
          for (int64_t e = 0; e < D; ++e)
            ref[static_cast<size_t>(e)] += w * load_as_double(v.data(), c.dtype, ((b * C + j) * Hkv + g) * D + e);
        }
        const double got_lse = load_as_double(hl.data(), DType::F32, (b * Hq + h) * Sq + i);
        if (limit == 0) {
          ASSERT_TRUE(std::isinf(got_lse) && got_lse < 0) << "row b=" << b << " i=" << i << " h=" << h
                                                          << " sees no key: LSE " << got_lse;
        } else {
          ASSERT_FALSE(std::isnan(got_lse)) << "b=" << b << " i=" << i << " h=" << h;
          worst_lse = std::max(worst_lse, std::fabs(got_lse - (m + std::log(sum))));
        }
        for (int64_t e = 0; e < D; ++e) {
          const double want = limit == 0 ? 0.0 : ref[static_cast<size_t>(e)] / sum;
          const double got = load_as_double(ho.data(), c.dtype, ((b * Sq + i) * Hq + h) * D + e);
          ASSERT_FALSE(std::isnan(got)) << "O is NaN at b=" << b << " i=" << i << " h=" << h << " e=" << e;
          ASSERT_LE(std::fabs(got - want), 2e-3 + std::ldexp(std::fabs(want), -8))
              << "b=" << b << " i=" << i << " h=" << h << " e=" << e << ": " << got << " vs " << want;
          worst_o = std::max(worst_o, std::fabs(got - want));
        }
      }
  EXPECT_LE(worst_lse, 1e-3);
  std::printf("decode %s Hq=%lld Hkv=%lld D=%lld Sq=%lld capacity=%lld: max |O - ref| %.2e, max |LSE - ref| %.2e\n",
              p.describe().c_str(), static_cast<long long>(Hq), static_cast<long long>(Hkv),
              static_cast<long long>(D), static_cast<long long>(Sq), static_cast<long long>(C), worst_o, worst_lse);
}

TEST(DecodeCuda, GqaRaggedLengthsOneSplit) {
  RT_REQUIRE_GPU();
  run_case({32, 8, 64, 1, 300, {0, 1, 63, 64, 65, 300}});
}

TEST(DecodeCuda, TwoRowsGroupOfSevenSeveralSplits) {
  RT_REQUIRE_GPU();
  // used = 1 with Sq = 2: row 0 sees no key; 2000 keys: four splits merged.
  run_case({28, 4, 128, 2, 2000, {1, 1500, 2000, 513}});
}

TEST(DecodeCuda, NoGqaFp16MaskNoneLongCache) {
  RT_REQUIRE_GPU();
  run_case({8, 8, 64, 1, 5000, {4999, 3}, DType::F16, MaskType::None});
}

TEST(DecodeCuda, MqaHeadDim128) {
  RT_REQUIRE_GPU();
  std::mt19937_64 rng(testing::fresh_seed());
  std::vector<int32_t> used(9);
  for (int32_t& u : used) u = static_cast<int32_t>(rng() % 701);
  run_case({16, 1, 128, 1, 700, used});
}

TEST(DecodeCuda, SmallHeadDims) {
  RT_REQUIRE_GPU();
  run_case({4, 2, 16, 1, 600, {600, 1, 300, 17}});
  run_case({8, 2, 32, 3, 70, {70, 2, 35}});
}

// A training call on the GPU: decode says why it cannot serve it.
TEST(DecodeCuda, RejectsCallsWithoutACache) {
  RT_REQUIRE_GPU();
  attention::AttnParams p = params_of({32, 8, 64, 1, 128, {128}});
  p.kv_cache = false;
  const std::vector<std::string> why = gpu_backend(BackendId::Decode)->unsupported_reasons(p);
  bool named = false;
  for (const std::string& w : why) named |= w.find("not a KV-cache call") != std::string::npos;
  EXPECT_TRUE(named);
}

}  // namespace
}  // namespace ringtrain
