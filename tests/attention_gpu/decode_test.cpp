// The CUDA `decode` backend (KV-cache calls: a few query rows per sequence against a padded cache with per-sequence
// used lengths) against an fp64 reference written here, on fresh random bf16/fp16 inputs with NaN-poisoned outputs:
// ragged used lengths (0, 1, tile edges, the whole capacity), head dims 16 to 128, GQA groups of 4 and 7, MQA, no GQA,
// Sq = 1 to 3 (rows that see no key), both masks a cache call takes, caches of one split and of several (merged
// partial results). Sliding windows (the reference's rows see [key_start, key_limit) of params.h): of one key, shorter
// than a 512-key split, spanning splits (rows whose keys all lie in later splits, splits wholly before every row's
// window), longer than the used length (bit-identical to no window), rows of one call with different starts (Sq up
// to 4), GQA and MQA, ragged used lengths; a windowed row bit-identical whatever batch it is decoded in.
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
  int64_t window = 0;
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
  p.window = c.window;
  return p;
}

// Host inputs and the call's results, downloaded.
struct DecodeRun {
  Tensor q, k, v, o, lse;
};

// The call on r.q, r.k, r.v through the selection, which must pick decode (every other backend giving the KV-cache
// reason), into NaN-poisoned outputs; fills r.o and r.lse.
void decode_on_gpu(const DecodeCase& c, DecodeRun& r) {
  const attention::AttnParams p = params_of(c);
  const int64_t B = p.batch, Sq = c.sq, Hq = c.hq, D = c.d;
  Tensor used = Tensor::empty({B}, DType::I32);
  for (int64_t b = 0; b < B; ++b) used.ptr<int32_t>()[b] = c.used[static_cast<size_t>(b)];

  const Tensor dq = upload(r.q), dk = upload(r.k), dv = upload(r.v), dused = upload(used);
  const Tensor o = poisoned_device({B, Sq, Hq, D}, c.dtype), lse = poisoned_device({B, Hq, Sq}, DType::F32);
  attention::AttnForwardArgs a;
  a.q = dq, a.k = dk, a.v = dv, a.o = o, a.lse = lse, a.kv_used = dused;
  const attention::Selection s = attention::explain(p);
  ASSERT_NE(s.backend, nullptr) << s.report();
  EXPECT_EQ(s.backend->id(), BackendId::Decode) << s.report();
  for (const attention::CandidateReport& cand : s.candidates) {
    if (cand.id == BackendId::Decode || !attention::find_backend(cand.id, DeviceKind::CUDA)) continue;
    bool named = false;
    for (const std::string& why : cand.reasons) named |= why == attention::kv_cache_reason();
    EXPECT_TRUE(named) << attention::backend_name(cand.id) << " does not give the KV-cache reason\n" << s.report();
  }
  const attention::DispatchCounts before = attention::dispatch_counts();
  attention::forward(p, a);
  EXPECT_EQ(attention::dispatch_counts().forward[static_cast<int>(BackendId::Decode)],
            before.forward[static_cast<int>(BackendId::Decode)] + 1);
  r.o = download(o), r.lse = download(lse);
}

// Fresh random inputs, decoded and checked against the fp64 reference; inputs and results to *out if given.
void run_case(const DecodeCase& c, DecodeRun* out = nullptr) {
  std::mt19937_64 rng(testing::fresh_seed());
  const attention::AttnParams p = params_of(c);
  const int64_t B = p.batch, Sq = c.sq, Hq = c.hq, Hkv = c.hkv, D = c.d, C = c.capacity;
  DecodeRun r;
  r.q = host_tensor({B, Sq, Hq, D}, c.dtype), r.k = host_tensor({B, C, Hkv, D}, c.dtype);
  r.v = host_tensor({B, C, Hkv, D}, c.dtype);
  for (const Tensor* t : {&r.q, &r.k, &r.v}) testing::fill_normal(*t, rng);
  decode_on_gpu(c, r);
  if (::testing::Test::HasFatalFailure()) return;
  const Tensor &q = r.q, &k = r.k, &v = r.v, &ho = r.o, &hl = r.lse;

  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  double worst_o = 0, worst_lse = 0;
  std::vector<double> score(static_cast<size_t>(C)), ref(static_cast<size_t>(D));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < Sq; ++i)
      for (int64_t h = 0; h < Hq; ++h) {
        const int64_t g = h / (Hq / Hkv), n_used = c.used[static_cast<size_t>(b)];
        const int64_t limit = attention::key_limit(c.mask, i, Sq, n_used);
        const int64_t start = std::min(attention::key_start(c.mask, c.window, i, Sq, n_used), limit);
        double m = -std::numeric_limits<double>::infinity(), sum = 0;
        for (int64_t j = start; j < limit; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < D; ++e)
            dot += load_as_double(q.data(), c.dtype, ((b * Sq + i) * Hq + h) * D + e) *
                   load_as_double(k.data(), c.dtype, ((b * C + j) * Hkv + g) * D + e);
          score[static_cast<size_t>(j)] = dot * scale;
          m = std::max(m, dot * scale);
        }
        std::fill(ref.begin(), ref.end(), 0.0);
        for (int64_t j = start; j < limit; ++j) {
          const double w = std::exp(score[static_cast<size_t>(j)] - m);
          sum += w;
          for (int64_t e = 0; e < D; ++e)
            ref[static_cast<size_t>(e)] += w * load_as_double(v.data(), c.dtype, ((b * C + j) * Hkv + g) * D + e);
        }
        const double got_lse = load_as_double(hl.data(), DType::F32, (b * Hq + h) * Sq + i);
        if (start == limit) {
          ASSERT_TRUE(std::isinf(got_lse) && got_lse < 0) << "row b=" << b << " i=" << i << " h=" << h
                                                          << " sees no key: LSE " << got_lse;
        } else {
          ASSERT_FALSE(std::isnan(got_lse)) << "b=" << b << " i=" << i << " h=" << h;
          worst_lse = std::max(worst_lse, std::fabs(got_lse - (m + std::log(sum))));
        }
        for (int64_t e = 0; e < D; ++e) {
          const double want = start == limit ? 0.0 : ref[static_cast<size_t>(e)] / sum;
          const double got = load_as_double(ho.data(), c.dtype, ((b * Sq + i) * Hq + h) * D + e);
          ASSERT_FALSE(std::isnan(got)) << "O is NaN at b=" << b << " i=" << i << " h=" << h << " e=" << e;
          ASSERT_LE(std::fabs(got - want), 2e-3 + std::ldexp(std::fabs(want), -8))
              << "b=" << b << " i=" << i << " h=" << h << " e=" << e << ": " << got << " vs " << want;
          worst_o = std::max(worst_o, std::fabs(got - want));
        }
      }
  EXPECT_LE(worst_lse, 1e-3);
  std::printf("decode %s: max |O - ref| %.2e, max |LSE - ref| %.2e\n", p.describe().c_str(), worst_o, worst_lse);
  if (out) *out = r;
}

// Sequence b's rows [B, Sq, Hq, D] (or its LSE [B, Hq, Sq]) as raw bytes.
std::vector<unsigned char> bytes_of(const Tensor& t, int64_t b) {
  const size_t n = t.nbytes() / static_cast<size_t>(t.size(0));
  const auto* p = static_cast<const unsigned char*>(t.data()) + static_cast<size_t>(b) * n;
  return {p, p + n};
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

// Windows of one key (each row sees only its diagonal) and shorter than a split, Sq = 3: the rows of one call start
// at three different keys; used lengths at tile edges and short enough that rows see no key.
TEST(DecodeCuda, WindowsOfOneKeyAndWithinASplit) {
  RT_REQUIRE_GPU();
  run_case({32, 8, 64, 1, 300, {0, 1, 63, 64, 65, 300}, DType::BF16, MaskType::CausalBottomRight, 1});
  run_case({8, 2, 64, 3, 300, {1, 2, 64, 65, 129, 300}, DType::BF16, MaskType::CausalBottomRight, 1});
  run_case({8, 2, 64, 3, 300, {1, 40, 64, 100, 300}, DType::BF16, MaskType::CausalBottomRight, 40});
}

// Windows about a split (512 keys) and spanning several, over a cache of four splits: rows whose visible keys all lie
// in later splits (the earlier ones skipped, weight 0 in the merge), windows ending and starting on split edges.
TEST(DecodeCuda, WindowsSpanningSplitsGroupOfSeven) {
  RT_REQUIRE_GPU();
  for (int64_t w : {64, 511, 512, 513, 600, 1100})
    run_case({28, 4, 128, 2, 2000, {1, 1500, 2000, 513, 1025, 1536}, DType::BF16, MaskType::CausalBottomRight, w});
}

// MQA with 16 rows per kv head (Sq = 4 x 4 heads): every row of a block starts elsewhere; fp16.
TEST(DecodeCuda, WindowMqaFourRowsFp16) {
  RT_REQUIRE_GPU();
  run_case({4, 1, 32, 4, 1100, {1100, 4, 2, 600, 513, 1024}, DType::F16, MaskType::CausalBottomRight, 5});
  run_case({4, 1, 32, 4, 1100, {1100, 4, 2, 600, 513, 1024}, DType::F16, MaskType::CausalBottomRight, 700});
}

// A window longer than a sequence's used length (but shorter than the cache, so the kernel takes it) hides none of
// its keys: its rows are bit-identical to the call without a window, while the longest sequence is windowed.
TEST(DecodeCuda, WindowLongerThanTheUsedLengthChangesNoBit) {
  RT_REQUIRE_GPU();
  const DecodeCase windowed{16, 4, 64, 2, 3000, {3000, 3, 1200, 1201}, DType::BF16, MaskType::CausalBottomRight, 1201};
  DecodeRun run;
  run_case(windowed, &run);
  if (HasFatalFailure()) return;
  DecodeCase plain = windowed;
  plain.window = 0;
  DecodeRun none{run.q, run.k, run.v, {}, {}};
  decode_on_gpu(plain, none);
  if (HasFatalFailure()) return;
  EXPECT_NE(bytes_of(run.o, 0), bytes_of(none.o, 0)) << "the window hid nothing of the 3000 keys";
  for (int64_t b = 1; b < 4; ++b) {
    EXPECT_EQ(bytes_of(run.o, b), bytes_of(none.o, b)) << "O of sequence " << b;
    EXPECT_EQ(bytes_of(run.lse, b), bytes_of(none.lse, b)) << "LSE of sequence " << b;
  }
}

// A windowed sequence decoded alone (batch 1, the same cache capacity) gives the bits it gives in a batch.
TEST(DecodeCuda, WindowedRowBitIdenticalWhateverTheBatch) {
  RT_REQUIRE_GPU();
  const DecodeCase batch{16, 2, 128, 2, 1700, {1700, 700, 5, 1030}, DType::BF16, MaskType::CausalBottomRight, 600};
  DecodeRun run;
  run_case(batch, &run);
  if (HasFatalFailure()) return;
  for (int64_t b = 0; b < 4; ++b) {
    DecodeCase one = batch;
    one.used = {batch.used[static_cast<size_t>(b)]};
    DecodeRun alone;
    alone.q = host_tensor({1, batch.sq, batch.hq, batch.d}, batch.dtype);
    alone.k = host_tensor({1, batch.capacity, batch.hkv, batch.d}, batch.dtype);
    alone.v = host_tensor({1, batch.capacity, batch.hkv, batch.d}, batch.dtype);
    copy(alone.q, run.q.view().slice(0, b, 1));
    copy(alone.k, run.k.view().slice(0, b, 1));
    copy(alone.v, run.v.view().slice(0, b, 1));
    decode_on_gpu(one, alone);
    if (HasFatalFailure()) return;
    EXPECT_EQ(bytes_of(alone.o, 0), bytes_of(run.o, b)) << "O of sequence " << b;
    EXPECT_EQ(bytes_of(alone.lse, 0), bytes_of(run.lse, b)) << "LSE of sequence " << b;
  }
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
