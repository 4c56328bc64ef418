// The CPU Policy (model/policy.h) against independent references: the per-sequence scoring path of
// model/logprobs.h, central finite differences of the fp64 model, each sequence scored alone (for the padded batch),
// the padded batch (for the packed one), one rank (for CP over in-process ranks), and entropies computed here from
// the full fp64 logits.
//
// Precision: TokenScores are fp32 whatever the policy's dtype, so an F64 policy's logprobs and entropies can only
// match an fp64 reference to fp32 rounding (2^-24 relative, checked at 3e-7 relative); its gradients are compared
// in fp64 through grads(), which is F64 for an F64 policy.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <random>

#include "model_test_util.h"
#include "ringtrain/attention/cpu/cpu_backends.h"
#include "ringtrain/attention/selection.h"
#include "ringtrain/comm/in_process.h"
#include "ringtrain/core/error.h"
#include "ringtrain/model/logprobs.h"
#include "ringtrain/model/policy.h"
#include "test_util.h"

namespace ringtrain {
namespace {

using attention::BackendId;
using model::Arch;
using model::Model;
using model::ModelConfig;
using model::Policy;
using model::PolicyOptions;
using model::TokenBatch;

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

PolicyOptions cpu_options(DType dtype, int64_t chunk = 5) {
  PolicyOptions o;
  o.dtype = dtype;
  o.logprob_chunk = chunk;  // smaller than the batches: several LM-head chunks
  o.model.attention_backends = {BackendId::Math};
  return o;
}

// Per token, N(0, 1) weights; entry 0 too, which the policy must ignore (there is no logprob at position 0).
std::vector<std::vector<float>> random_weights(const TokenBatch& batch, std::mt19937_64& rng) {
  std::normal_distribution<float> nd;
  std::vector<std::vector<float>> w;
  for (const auto& seq : batch.sequences) {
    w.emplace_back(seq.size());
    for (float& x : w.back()) x = nd(rng);
  }
  return w;
}

std::vector<double> grads_f64(Policy& p) {
  const TensorView g = p.grads();
  EXPECT_EQ(g.dtype, DType::F64);
  const double* d = static_cast<const double*>(g.data);
  return {d, d + g.numel()};
}

std::vector<double> grads_as_f64(Policy& p) {
  const TensorView g = p.grads();
  std::vector<double> out(static_cast<size_t>(g.numel()));
  copy(contiguous_view(out.data(), DType::F64, Device::cpu(), {g.numel()}), g);
  return out;
}

double rel_l2(const std::vector<double>& a, const std::vector<double>& b) {
  return testing::rel_error(contiguous_view(const_cast<double*>(a.data()), DType::F64, Device::cpu(),
                                            {static_cast<int64_t>(a.size())}),
                            contiguous_view(const_cast<double*>(b.data()), DType::F64, Device::cpu(),
                                            {static_cast<int64_t>(b.size())}));
}

// |got - want| within `rel` of |want| (plus a tiny absolute floor for values near 0); NaN fails.
void expect_close(const std::vector<float>& got, const std::vector<double>& want, double rel, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t p = 0; p < want.size(); ++p)
    ASSERT_LE(std::fabs(got[p] - want[p]), rel * std::fabs(want[p]) + 1e-30) << what << " position " << p;
}

TokenBatch three_sequences(const ModelConfig& c, std::mt19937_64& rng) {
  // The longest in the middle: the first and last sequences are padded.
  return TokenBatch{{testing::random_ids(5, c.vocab, rng), testing::random_ids(11, c.vocab, rng),
                     testing::random_ids(8, c.vocab, rng)}};
}

class PolicyArch : public ::testing::TestWithParam<Arch> {
 protected:
  void SetUp() override { attention::cpu::set_math_fp64(true); }
  void TearDown() override { attention::cpu::set_math_fp64(false); }
};

TEST_P(PolicyArch, F64MatchesSequencePathAndFiniteDifferences) {
  std::mt19937_64 rng(testing::fresh_seed());
  const ModelConfig c = testing::tiny_config(GetParam(), GetParam() == Arch::Mistral);
  const std::vector<float> params = testing::tiny_params(c, rng);
  const auto policy = model::make_policy(c, params, cpu_options(DType::F64));
  ASSERT_EQ(policy->dtype(), DType::F64);
  const TokenBatch batch{{testing::random_ids(9, c.vocab, rng)}};
  const std::vector<std::vector<float>> w = random_weights(batch, rng);
  ASSERT_NE(w[0][0], 0.f);

  policy->zero_grads();
  const model::TokenScores scores = policy->score(batch, /*for_backward=*/true);
  policy->backward(w);
  const std::vector<double> grads = grads_f64(*policy);

  // The per-sequence path, with w[0] dropped (it scores nothing).
  Model<double> ref(c, params, cpu_options(DType::F64).model);
  auto attn = model::make_local_attention();
  const std::vector<int32_t>& ids = batch.sequences[0];
  std::vector<double> r(w[0].begin(), w[0].end());
  r[0] = 0;
  ref.zero_grads();
  const std::vector<double> ref_lp = model::sequence_logprobs(ref, ids, *attn, 4, true);
  model::sequence_logprobs_backward(ref, ids, r, *attn, 4);
  EXPECT_EQ(scores.logprobs[0][0], 0.f);
  expect_close(scores.logprobs[0], ref_lp, 3e-7, "logprob");
  EXPECT_LE(rel_l2(grads, ref.grads()), 1e-12);

  // Central differences of sum_p w_p logprob_p in fp64 (the fp64 model at the same weights), a few elements of
  // every tensor; bounds as in model_grad_test (the attention LSE is fp32 by convention: ~1e-7 relative).
  const auto loss = [&] {
    const std::vector<double> lp = model::sequence_logprobs(ref, ids, *attn, 4);
    double s = 0;
    for (size_t p = 0; p < lp.size(); ++p) s += r[p] * lp[p];
    return s;
  };
  const double h = 1e-5;
  std::uniform_int_distribution<int64_t> pick;
  for (size_t t = 0; t < policy->layout().specs().size(); ++t) {
    const model::ParamSpec& s = policy->layout().specs()[t];
    for (int k = 0; k < 3; ++k) {
      const int64_t i = s.offset + pick(rng) % s.numel;
      double& x = ref.params()[i];
      const double keep = x;
      x = keep + h;
      const double up = loss();
      x = keep - h;
      const double down = loss();
      x = keep;
      const double fd = (up - down) / (2 * h);
      const double g = grads[policy->flat_offsets()[t] + (i - s.offset)];
      ASSERT_TRUE(std::isfinite(g)) << s.name;
      ASSERT_NEAR(g, fd, 1e-6 + 2e-5 * std::fabs(fd)) << s.name << " element " << i - s.offset;
    }
  }
}

TEST_P(PolicyArch, PaddedBatchEqualsEachSequenceAlone) {
  std::mt19937_64 rng(testing::fresh_seed());
  const ModelConfig c = testing::tiny_config(GetParam(), GetParam() == Arch::Qwen3);
  const std::vector<float> params = testing::tiny_params(c, rng);
  const TokenBatch batch = three_sequences(c, rng);
  const std::vector<std::vector<float>> w = random_weights(batch, rng);

  const auto together = model::make_policy(c, params, cpu_options(DType::F64));
  together->zero_grads();
  const model::TokenScores all = together->score(batch, true, /*with_entropy=*/true);
  together->backward(w);

  const auto alone = model::make_policy(c, params, cpu_options(DType::F64));
  alone->zero_grads();
  for (size_t b = 0; b < batch.sequences.size(); ++b) {
    const model::TokenScores one = alone->score(TokenBatch{{batch.sequences[b]}}, true, true);
    alone->backward({w[b]});  // adds into the gradients of the sequences before
    ASSERT_EQ(all.logprobs[b].size(), batch.sequences[b].size());
    ASSERT_EQ(all.entropy[b].size(), batch.sequences[b].size());
    expect_close(all.logprobs[b], std::vector<double>(one.logprobs[0].begin(), one.logprobs[0].end()), 3e-7,
                 "logprob of sequence " + std::to_string(b));
    expect_close(all.entropy[b], std::vector<double>(one.entropy[0].begin(), one.entropy[0].end()), 3e-7,
                 "entropy of sequence " + std::to_string(b));
  }
  // fp64 throughout; only the order of the gradient sums over rows differs.
  EXPECT_LE(rel_l2(grads_f64(*together), grads_f64(*alone)), 1e-12);
}

// Lengths of the packed tests: a one-token sequence (no logprob at all), odd lengths, and the longest last.
TokenBatch mixed_lengths(const ModelConfig& c, std::mt19937_64& rng, bool packed) {
  TokenBatch batch{{testing::random_ids(7, c.vocab, rng), testing::random_ids(1, c.vocab, rng),
                    testing::random_ids(33, c.vocab, rng), testing::random_ids(64, c.vocab, rng)}};
  batch.packed = packed;
  return batch;
}

// Packed (one row, positions restarting, attention per sequence) against padded ([B, S_max]) at the same weights:
// any attention across sequences or wrong position would change the scores of every later sequence.
TEST_P(PolicyArch, PackedEqualsPadded) {
  for (DType dtype : {DType::F64, DType::F32}) {
    std::mt19937_64 rng(testing::fresh_seed());
    const ModelConfig c = testing::tiny_config(GetParam(), GetParam() == Arch::Llama);
    const std::vector<float> params = testing::tiny_params(c, rng);
    const TokenBatch packed = mixed_lengths(c, rng, true);
    TokenBatch padded = packed;
    padded.packed = false;
    const std::vector<std::vector<float>> w = random_weights(packed, rng);

    const auto a = model::make_policy(c, params, cpu_options(dtype));
    a->zero_grads();
    const model::TokenScores got = a->score(packed, true, /*with_entropy=*/true);
    a->backward(w);
    const auto b = model::make_policy(c, params, cpu_options(dtype));
    b->zero_grads();
    const model::TokenScores want = b->score(padded, true, true);
    b->backward(w);

    // F64: the same fp64 values rounded to fp32 (one fp32 ulp apart at most: 3e-7); F32: reordered fp32 sums.
    const double score_tol = dtype == DType::F64 ? 3e-7 : 1e-5;
    ASSERT_EQ(got.logprobs.size(), packed.sequences.size());
    ASSERT_EQ(got.entropy.size(), packed.sequences.size());
    for (size_t s = 0; s < packed.sequences.size(); ++s) {
      const std::string what = std::string(dtype_name(dtype)) + " sequence " + std::to_string(s);
      ASSERT_EQ(got.logprobs[s].size(), packed.sequences[s].size()) << what;
      EXPECT_EQ(got.logprobs[s][0], 0.f) << what;
      expect_close(got.logprobs[s], std::vector<double>(want.logprobs[s].begin(), want.logprobs[s].end()), score_tol,
                   "logprob of " + what);
      expect_close(got.entropy[s], std::vector<double>(want.entropy[s].begin(), want.entropy[s].end()), score_tol,
                   "entropy of " + what);
    }
    // Only the order of the gradient sums over rows differs: 1e-12 in fp64, 1e-5 in fp32.
    EXPECT_LE(rel_l2(grads_as_f64(*a), grads_as_f64(*b)), dtype == DType::F64 ? 1e-12 : 1e-5) << dtype_name(dtype);
  }
}

INSTANTIATE_TEST_SUITE_P(Arch, PolicyArch, ::testing::Values(Arch::Llama, Arch::Qwen2, Arch::Qwen3, Arch::Mistral),
                         [](const auto& info) { return std::string(model::arch_model_type(info.param)); });

// Entropy from the chunked LM head against an fp64 reference from the full logits, for random hidden states and
// head weights with a large scale (peaked rows), in both float types.
template <typename T>
void check_head_entropy(double tolerance) {
  std::mt19937_64 rng(testing::fresh_seed());
  const int64_t n = 7, hidden = 6, vocab = 23;
  std::normal_distribution<double> nd;
  std::vector<T> h(n * hidden), head(vocab * hidden);
  for (T& x : h) x = static_cast<T>(nd(rng));
  for (T& x : head) x = static_cast<T>(nd(rng));
  for (int64_t j = 0; j < hidden; ++j) h[2 * hidden + j] *= 20;  // row 2: nearly one-hot
  std::vector<int32_t> targets(n);
  for (int64_t i = 0; i < n; ++i) targets[i] = static_cast<int32_t>((5 * i) % vocab);
  targets[4] = -1;  // entropy even where there is no target
  std::vector<T> lp(n, static_cast<T>(kNan)), ent(n, static_cast<T>(kNan));
  model::token_logprobs(lp.data(), h.data(), head.data(), targets.data(), n, hidden, vocab, 3, ent.data());
  for (int64_t i = 0; i < n; ++i) {
    std::vector<double> z(vocab);
    double mx = -INFINITY;
    for (int64_t v = 0; v < vocab; ++v) {
      double s = 0;
      for (int64_t j = 0; j < hidden; ++j) s += double(h[i * hidden + j]) * double(head[v * hidden + j]);
      z[v] = s, mx = std::max(mx, s);
    }
    double sum = 0;
    for (double x : z) sum += std::exp(x - mx);
    double want = 0;
    for (double x : z) {
      const double logp = x - mx - std::log(sum);
      want -= std::exp(logp) * logp;
    }
    EXPECT_NEAR(double(ent[i]), want, tolerance) << "row " << i;  // NaN fails
  }
}

// fp32 logits carry ~1e-6 relative error of values up to ~100 (row 2): 1e-4 on an entropy <= log(23).
TEST(PolicyEntropy, ChunkedHeadFp32) { check_head_entropy<float>(1e-4); }
TEST(PolicyEntropy, ChunkedHeadFp64) { check_head_entropy<double>(1e-11); }

// The policy's entropies against the full fp64 logits of the model's final hidden states.
TEST(PolicyEntropy, MatchesFullLogits) {
  std::mt19937_64 rng(testing::fresh_seed());
  const ModelConfig c = testing::tiny_config(Arch::Qwen2, /*tied=*/true);
  const std::vector<float> params = testing::tiny_params(c, rng);
  const TokenBatch batch = three_sequences(c, rng);
  const auto policy = model::make_policy(c, params, cpu_options(DType::F64));
  const model::TokenScores s = policy->score(batch, false, true);
  Model<double> m(c, params, cpu_options(DType::F64).model);
  auto attn = model::make_local_attention();
  for (size_t b = 0; b < batch.sequences.size(); ++b) {
    const auto& ids = batch.sequences[b];
    const std::vector<int32_t> pos = model::iota_positions(ids.size());
    const std::vector<double> hidden =
        m.forward(ids.data(), pos.data(), 1, static_cast<int64_t>(ids.size()), *attn, false);
    std::vector<double> want(ids.size(), 0.0);
    for (size_t p = 1; p < ids.size(); ++p) {  // row p - 1 predicts token p
      std::vector<double> z(c.vocab);
      for (int64_t v = 0; v < c.vocab; ++v) {
        double acc = 0;
        for (int64_t j = 0; j < c.hidden; ++j) acc += hidden[(p - 1) * c.hidden + j] * m.lm_head()[v * c.hidden + j];
        z[v] = acc;
      }
      const double mx = *std::max_element(z.begin(), z.end());
      double sum = 0;
      for (double x : z) sum += std::exp(x - mx);
      for (double x : z) want[p] -= std::exp(x - mx) / sum * (x - mx - std::log(sum));
    }
    expect_close(s.entropy[b], want, 3e-7, "entropy of sequence " + std::to_string(b));
  }
}

// cp = 2 and 3 in-process ranks, each with its own policy over the group, against one rank: logprobs gathered back
// on every rank, gradients summed over the ranks.
struct CpCase {
  int cp;
  cp::CpComm comm;
  DType dtype;
};
void PrintTo(const CpCase& k, std::ostream* os) {
  *os << "cp" << k.cp << " " << cp::cp_comm_name(k.comm) << " " << dtype_name(k.dtype);
}
class PolicyCp : public ::testing::TestWithParam<CpCase> {
 protected:
  void SetUp() override { attention::cpu::set_math_fp64(true); }
  void TearDown() override { attention::cpu::set_math_fp64(false); }
};

TEST_P(PolicyCp, EqualsOneRank) {
  const CpCase k = GetParam();
  std::mt19937_64 rng(testing::fresh_seed());
  const ModelConfig c = testing::tiny_config(Arch::Llama);
  const std::vector<float> params = testing::tiny_params(c, rng);
  // Lengths that need zigzag padding and one shorter than 2 * cp (whole chunks of padding).
  const TokenBatch batch{{testing::random_ids(13, c.vocab, rng), testing::random_ids(4, c.vocab, rng),
                          testing::random_ids(9, c.vocab, rng)}};
  const std::vector<std::vector<float>> w = random_weights(batch, rng);

  const auto one = model::make_policy(c, params, cpu_options(k.dtype));
  const model::TokenScores want = one->score(batch, true, true);
  one->backward(w);
  const std::vector<double> want_grads = grads_as_f64(*one);

  std::vector<model::TokenScores> got(k.cp);
  std::vector<std::vector<double>> grads(k.cp);
  comm::run_ranks(k.cp, std::chrono::seconds(60), [&](comm::Communicator& comm) {
    PolicyOptions o = cpu_options(k.dtype);
    o.cp_group = &comm;
    o.cp.comm = k.comm;
    const auto p = model::make_policy(c, params, o);
    got[comm.rank()] = p->score(batch, true, true);
    p->backward(w);
    grads[comm.rank()] = grads_as_f64(*p);
  });
  // Scores of magnitude 3-7: F64 agrees to the fp32 LSE's ~1e-7 relative and the fp32 rounding of TokenScores (one
  // ulp, 4.8e-7 at 6): measured up to 1.43e-6 (3 ulps at -5.92, seed 12651017260274323992, 1 run in ~500), so 4e-6;
  // F32 to reordered fp32 sums, ~1e-6 relative. A misplaced token or shard moves a score by 1e-2 or more.
  const double tol = k.dtype == DType::F64 ? 4e-6 : 4e-5;
  for (int r = 0; r < k.cp; ++r)
    for (size_t b = 0; b < batch.sequences.size(); ++b)
      for (size_t p = 0; p < batch.sequences[b].size(); ++p) {
        ASSERT_NEAR(got[r].logprobs[b][p], want.logprobs[b][p], tol) << "rank " << r << " seq " << b << " pos " << p;
        ASSERT_NEAR(got[r].entropy[b][p], want.entropy[b][p], tol) << "rank " << r << " seq " << b << " pos " << p;
      }
  std::vector<double> sum(want_grads.size(), 0.0);
  for (const auto& g : grads)
    for (size_t i = 0; i < g.size(); ++i) sum[i] += g[i];
  // F64 gradients: the CP merge of partial attention results goes through the attention layer's fp32 LSE (its
  // convention), ~6e-8 relative per merge. Relative L2 error over 600 random F64 runs: median 1.2e-7, 99th
  // percentile 6.4e-7, a tail to 1.8e-6; F32 (reordered fp32 sums) over 400: at most 2.3e-6. 1e-5 for both keeps
  // several times the worst seen; a wrong gradient is off by O(1).
  EXPECT_LE(rel_l2(sum, want_grads), 1e-5);
}

// Packed under CP (every sequence zigzag-sharded on its own) against packed on one rank.
TEST_P(PolicyCp, PackedEqualsOneRank) {
  const CpCase k = GetParam();
  std::mt19937_64 rng(testing::fresh_seed());
  const ModelConfig c = testing::tiny_config(Arch::Qwen2);
  const std::vector<float> params = testing::tiny_params(c, rng);
  const TokenBatch batch = mixed_lengths(c, rng, true);
  const std::vector<std::vector<float>> w = random_weights(batch, rng);

  const auto one = model::make_policy(c, params, cpu_options(k.dtype));
  const model::TokenScores want = one->score(batch, true, true);
  one->backward(w);
  const std::vector<double> want_grads = grads_as_f64(*one);

  std::vector<model::TokenScores> got(k.cp);
  std::vector<std::vector<double>> grads(k.cp);
  comm::run_ranks(k.cp, std::chrono::seconds(60), [&](comm::Communicator& comm) {
    PolicyOptions o = cpu_options(k.dtype);
    o.cp_group = &comm;
    o.cp.comm = k.comm;
    const auto p = model::make_policy(c, params, o);
    got[comm.rank()] = p->score(batch, true, true);
    p->backward(w);
    grads[comm.rank()] = grads_as_f64(*p);
  });
  // F64: each CP merge rounds the partial LSEs to fp32 (the attention layer's convention), one fp32 ulp of an LSE of
  // a few units is ~5e-7 relative on the merged output, which reaches the logprobs (of ~1 to 8) as up to 1.5e-6
  // absolute (observed over hundreds of random runs), so 5e-6. F32: reordered fp32 sums, 4e-5 as in EqualsOneRank.
  const double tol = k.dtype == DType::F64 ? 5e-6 : 4e-5;
  for (int r = 0; r < k.cp; ++r) {
    ASSERT_EQ(got[r].logprobs.size(), batch.sequences.size());
    for (size_t b = 0; b < batch.sequences.size(); ++b) {
      ASSERT_EQ(got[r].logprobs[b].size(), batch.sequences[b].size());
      for (size_t p = 0; p < batch.sequences[b].size(); ++p) {
        ASSERT_NEAR(got[r].logprobs[b][p], want.logprobs[b][p], tol) << "rank " << r << " seq " << b << " pos " << p;
        ASSERT_NEAR(got[r].entropy[b][p], want.entropy[b][p], tol) << "rank " << r << " seq " << b << " pos " << p;
      }
    }
  }
  std::vector<double> sum(want_grads.size(), 0.0);
  for (const auto& g : grads)
    for (size_t i = 0; i < g.size(); ++i) sum[i] += g[i];
  // As in EqualsOneRank; packed, over 900 random F64 runs: median 2e-7, 99th percentile 7e-7, a tail to 2.5e-6 (a
  // seed of CI's sanitized run); F32 over 600: at most 3.1e-6.
  EXPECT_LE(rel_l2(sum, want_grads), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Parity, PolicyCp,
                         ::testing::Values(CpCase{2, cp::CpComm::Ring, DType::F64},
                                           CpCase{3, cp::CpComm::Ring, DType::F64},
                                           CpCase{3, cp::CpComm::AllGather, DType::F32},
                                           CpCase{2, cp::CpComm::Ring, DType::F32},
                                           CpCase{2, cp::CpComm::AllToAll, DType::F64}));

// One rank, packed: each layer's attention is one packed call for the whole batch (not one call per sequence), in
// the forward and in the backward.
TEST(PolicyPacked, OneAttentionCallPerLayer) {
  std::mt19937_64 rng(testing::fresh_seed());
  const ModelConfig c = testing::tiny_config(Arch::Qwen3, false, /*layers=*/3);
  const auto policy = model::make_policy(c, testing::tiny_params(c, rng), cpu_options(DType::F32));
  const TokenBatch batch = mixed_lengths(c, rng, true);
  attention::reset_dispatch_counts();
  policy->score(batch, true);
  policy->backward(random_weights(batch, rng));
  const attention::DispatchCounts n = attention::dispatch_counts();
  const int math = static_cast<int>(BackendId::Math);
  EXPECT_EQ(n.forward[math], c.layers) << attention::format_dispatch_counts(n);
  EXPECT_EQ(n.backward[math], c.layers) << attention::format_dispatch_counts(n);
  EXPECT_EQ(n.total(), 2 * c.layers) << attention::format_dispatch_counts(n);
  // Gradients of the wrong shape are refused as for a padded batch.
  policy->score(batch, true);
  std::vector<std::vector<float>> short_grads = random_weights(batch, rng);
  short_grads[2].pop_back();
  EXPECT_THROW(policy->backward(short_grads), Error);
}

TEST(PolicyParams, RoundTripAndNames) {
  std::mt19937_64 rng(testing::fresh_seed());
  const ModelConfig c = testing::tiny_config(Arch::Qwen3);
  const auto policy = model::make_policy(c, testing::tiny_params(c, rng), cpu_options(DType::F32));
  const std::vector<float> other = testing::tiny_params(c, rng);
  policy->set_params(other);
  EXPECT_EQ(policy->params(), other);
  const auto& spec = policy->layout().specs()[3];
  EXPECT_EQ(policy->param(spec.name),
            std::vector<float>(other.begin() + spec.offset, other.begin() + spec.offset + spec.numel));
  // The new weights score as a policy made with them.
  const TokenBatch batch{{testing::random_ids(6, c.vocab, rng)}};
  const auto fresh = model::make_policy(c, other, cpu_options(DType::F32));
  EXPECT_EQ(policy->score(batch, false).logprobs, fresh->score(batch, false).logprobs);

  EXPECT_THROW(policy->set_params(std::vector<float>(3)), Error);
  try {
    policy->grad("model.layers.9.no_such.weight");
    FAIL() << "an unknown name must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.9.no_such.weight"), std::string::npos) << e.what();
  }
}

// Policies over one shared, read-only weight buffer (in-process ranks that score): they read it in place, score as
// a policy owning a copy does (bit for bit), and a write to one policy's weights goes to its own copy, never to the
// shared buffer or the other policies.
TEST(PolicyParams, SharedWeightsAreReadInPlaceAndCopiedOnWrite) {
  std::mt19937_64 rng(testing::fresh_seed());
  const ModelConfig c = testing::tiny_config(Arch::Llama);
  const auto shared = std::make_shared<const std::vector<float>>(testing::tiny_params(c, rng));
  const std::vector<float> original = *shared;

  const Model<float> model(c, shared);
  EXPECT_TRUE(model.shares_params());
  EXPECT_EQ(model.params().data(), shared->data());  // no copy
  Model<float> writer(c, shared);
  writer.params()[0] += 1.0f;
  EXPECT_FALSE(writer.shares_params());
  EXPECT_NE(writer.params().data(), shared->data());
  EXPECT_EQ(*shared, original);
  const Model<double> wide(c, shared);  // converts: nothing to share with fp64
  EXPECT_FALSE(wide.shares_params());

  const TokenBatch batch{{testing::random_ids(9, c.vocab, rng), testing::random_ids(4, c.vocab, rng)}};
  const auto owning = model::make_policy(c, original, cpu_options(DType::F32));
  const auto a = model::make_policy(c, shared, cpu_options(DType::F32));
  const auto b = model::make_policy(c, shared, cpu_options(DType::F32));
  const auto want = owning->score(batch, false).logprobs;
  EXPECT_EQ(a->score(batch, false).logprobs, want);
  EXPECT_EQ(shared.use_count(), 4);  // `shared`, `model`, `a` and `b`: all read it in place
  std::vector<float> moved = original;
  for (float& x : moved) x *= 0.5f;
  a->set_params(moved);
  EXPECT_EQ(*shared, original);
  EXPECT_EQ(b->score(batch, false).logprobs, want);
  EXPECT_NE(a->score(batch, false).logprobs, want);
  static_cast<float*>(b->weights().data)[1] = 3.0f;  // a writable view: b's own copy from here on
  EXPECT_EQ(*shared, original);
  EXPECT_EQ(model::make_policy(c, shared, cpu_options(DType::F64))->score(batch, false).logprobs.size(), 2u);
}

TEST(PolicyErrors, BadBatchesAndBackwardOrder) {
  std::mt19937_64 rng(testing::fresh_seed());
  const ModelConfig c = testing::tiny_config(Arch::Llama);
  const auto policy = model::make_policy(c, testing::tiny_params(c, rng), cpu_options(DType::F32));
  EXPECT_THROW(policy->backward({{0.f, 1.f}}), Error);  // nothing scored for backward
  EXPECT_THROW(policy->score(TokenBatch{}, false), Error);
  EXPECT_THROW(policy->score(TokenBatch{{{1, 2}, {}}}, false), Error);
  EXPECT_THROW(policy->score(TokenBatch{{{1, static_cast<int32_t>(c.vocab)}}}, false), Error);
  EXPECT_THROW(policy->score(TokenBatch{{{1, -3}}}, false), Error);
  const TokenBatch batch{{{1, 2, 3}, {4, 5}}};
  policy->score(batch, true);
  EXPECT_THROW(policy->backward({{0.f, 1.f, 2.f}}), Error);              // one sequence of two
  EXPECT_THROW(policy->backward({{0.f, 1.f, 2.f}, {0.f, 1.f, 2.f}}), Error);  // the second has 2 tokens
  PolicyOptions bad = cpu_options(DType::BF16);
  EXPECT_THROW(model::make_policy(c, testing::tiny_params(c, rng), bad), Error);
}

TEST(PolicyBuffers, ViewsAndZeroGrads) {
  std::mt19937_64 rng(testing::fresh_seed());
  const ModelConfig c = testing::tiny_config(Arch::Qwen2);
  const std::vector<float> params = testing::tiny_params(c, rng);
  const auto policy = model::make_policy(c, params, cpu_options(DType::F32));
  const TensorView wv = policy->weights();
  ASSERT_EQ(wv.numel(), policy->layout().total());
  for (size_t t = 0; t < policy->layout().specs().size(); ++t) {
    const auto& s = policy->layout().specs()[t];
    EXPECT_EQ(static_cast<const float*>(wv.data)[policy->flat_offsets()[t]], params[s.offset]) << s.name;
  }
  const TokenBatch batch{{testing::random_ids(7, c.vocab, rng)}};
  policy->score(batch, true);
  policy->backward(random_weights(batch, rng));
  const std::vector<float> g = policy->grads_by_layout();
  double norm = 0;
  for (float x : g) norm += double(x) * x;
  EXPECT_GT(norm, 0.0);
  policy->zero_grads();
  for (float x : policy->grads_by_layout()) ASSERT_EQ(x, 0.f);
}

}  // namespace
}  // namespace ringtrain
