// The GPU Policy (BF16) against the CPU F64 Policy on the same bf16-rounded weights: logprobs, entropies and
// gradients of a padded and of a packed batch of several lengths (the packed one through each GPU attention backend
// too); the device buffers (grads() after zero_grads(), flat_offsets()) and the bf16 round trip of set_params /
// params(). Skips without a GPU.
//
// Tolerances (bf16: unit roundoff 2^-9 ≈ 2e-3 per rounding). A single token's logprob is the noisiest quantity: a
// difference of logits of magnitude ~10 after ~15 bf16 roundings of activations per layer; measured on an H200 its
// error has a mean of 0.010-0.013 and a heavy tail (0.13 at |logprob| 7.6 for qwen3 with QK norm). So per element
// 5e-2 + |logprob| / 32 (a wrong weight, position or document boundary is an O(1) error), and a mean absolute error
// of at most 3e-2 over all positions (measured 0.011-0.021, qwen3 highest; a systematic error, e.g. a wrong scale,
// moves every logprob by O(0.1) or more). Entropies average over the vocabulary
// (measured mean 0.0015): 2e-2 + |entropy| / 128 per element, mean at most 5e-3;
// gradients 8e-2 relative L2 per tensor (floored at 1e-3 of the whole gradient's norm, for tensors whose gradient is
// nearly zero): each term passes through several bf16 roundings (measured worst 0.056, qwen3's q_norm/k_norm weights,
// whose gradients are sums over every head and token of products through the per-head RMSNorm backward); a missing
// or wrong term is an O(1) error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "model/model_test_util.h"
#include "ringtrain/attention/cpu/cpu_backends.h"
#include "ringtrain/attention/selection.h"
#include "ringtrain/core/error.h"
#include "ringtrain/core/tensor.h"
#include "ringtrain/model/policy.h"
#include "test_util.h"

namespace ringtrain {
namespace {

using model::Arch;
using model::ModelConfig;
using model::Policy;
using model::PolicyOptions;
using model::TokenBatch;

constexpr double kLogprobTol = 5e-2, kLogprobRelTol = 1.0 / 32, kLogprobMeanTol = 3e-2;
constexpr double kEntropyTol = 2e-2, kEntropyRelTol = 1.0 / 128, kEntropyMeanTol = 5e-3;
constexpr double kGradRelTol = 8e-2;

std::vector<float> round_to_bf16(const std::vector<float>& v) {
  const int64_t n = static_cast<int64_t>(v.size());
  const Tensor b = Tensor::empty({n}, DType::BF16);
  copy(b, contiguous_view(const_cast<float*>(v.data()), DType::F32, Device::cpu(), {n}));
  std::vector<float> out(v.size());
  copy(contiguous_view(out.data(), DType::F32, Device::cpu(), {n}), b);
  return out;
}

std::vector<double> download_f64(const TensorView& t) {
  std::vector<double> out(static_cast<size_t>(t.numel()));
  copy(contiguous_view(out.data(), DType::F64, Device::cpu(), {t.numel()}), t);
  return out;
}

ModelConfig gpu_config(Arch arch, bool tied) {
  ModelConfig c = testing::tiny_config(arch, tied, /*layers=*/2);
  c.hidden = 256, c.heads = 4, c.kv_heads = 2, c.head_dim = 64, c.ffn = 512, c.vocab = 1000;
  return c;
}

// Transformers' initialisation scaled up 2x, bf16-rounded (both policies see the same weights), as in
// gpu_model_test's CP test: attention far from uniform, yet logits small enough that bf16 noise is not amplified
// (tiny_params' O(1) weights at this width give logits so large that bf16 runs differ by ~0.5 in a logprob).
std::vector<float> gpu_params(const ModelConfig& c, std::mt19937_64& rng) {
  std::vector<float> p = model::random_params(model::ParamLayout(c), rng());
  for (float& x : p) x *= 2;
  return round_to_bf16(p);
}

PolicyOptions gpu_options() {
  PolicyOptions o;
  o.device = Device::cuda(0);
  o.dtype = DType::BF16;
  o.logprob_chunk = 48;  // several LM-head chunks over the batch
  return o;
}

struct Variant {
  const char* name;
  Arch arch;
  bool tied;
};
void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }
class GpuPolicy : public ::testing::TestWithParam<Variant> {};

// Scores and gradients of `batch` on the GPU policy against the CPU F64 policy (which runs it padded, whatever
// batch.packed says: the reference layout).
void expect_matches_cpu_f64(const ModelConfig& c, const std::vector<float>& params, const TokenBatch& batch,
                            const PolicyOptions& gpu_opts, std::mt19937_64& rng) {
  std::vector<std::vector<float>> w;
  std::normal_distribution<float> nd;
  for (const auto& s : batch.sequences) {
    w.emplace_back(s.size());
    for (float& x : w.back()) x = nd(rng);
  }

  const auto gpu = model::make_policy(c, params, gpu_opts);
  ASSERT_EQ(gpu->dtype(), DType::BF16);
  PolicyOptions cpu_opts;
  cpu_opts.dtype = DType::F64;
  cpu_opts.model.attention_backends = {attention::BackendId::Math};
  const auto cpu = model::make_policy(c, params, cpu_opts);
  TokenBatch padded = batch;
  padded.packed = false;

  gpu->zero_grads(), cpu->zero_grads();
  const model::TokenScores got = gpu->score(batch, true, /*with_entropy=*/true);
  gpu->backward(w);
  attention::cpu::set_math_fp64(true);
  const model::TokenScores want = cpu->score(padded, true, true);
  cpu->backward(w);
  attention::cpu::set_math_fp64(false);

  ASSERT_EQ(got.logprobs.size(), batch.sequences.size());
  ASSERT_EQ(got.entropy.size(), batch.sequences.size());
  double lp_sum = 0, ent_sum = 0;
  size_t positions = 0;
  for (size_t b = 0; b < batch.sequences.size(); ++b) {
    ASSERT_EQ(got.logprobs[b].size(), batch.sequences[b].size());
    ASSERT_EQ(got.entropy[b].size(), batch.sequences[b].size());
    EXPECT_EQ(got.logprobs[b][0], 0.f);
    EXPECT_EQ(got.entropy[b][0], 0.f);
    for (size_t p = 0; p < batch.sequences[b].size(); ++p) {
      const double lp_err = std::fabs(got.logprobs[b][p] - want.logprobs[b][p]);
      const double ent_err = std::fabs(got.entropy[b][p] - want.entropy[b][p]);
      ASSERT_LE(lp_err, kLogprobTol + kLogprobRelTol * std::fabs(want.logprobs[b][p]))  // NaN fails
          << "sequence " << b << " position " << p << ": " << got.logprobs[b][p] << " vs " << want.logprobs[b][p];
      ASSERT_LE(ent_err, kEntropyTol + kEntropyRelTol * std::fabs(want.entropy[b][p]))
          << "sequence " << b << " position " << p << ": " << got.entropy[b][p] << " vs " << want.entropy[b][p];
      lp_sum += lp_err, ent_sum += ent_err, ++positions;
    }
  }
  std::printf("[logprobs vs CPU f64] mean abs error %.4g, entropies %.4g over %zu positions\n", lp_sum / positions,
              ent_sum / positions, positions);
  EXPECT_LE(lp_sum / positions, kLogprobMeanTol);
  EXPECT_LE(ent_sum / positions, kEntropyMeanTol);

  const std::vector<float> g = gpu->grads_by_layout(), ref = cpu->grads_by_layout();
  double all = 0;
  for (float x : ref) all += double(x) * x;
  const double floor = 1e-3 * std::sqrt(all);
  ASSERT_GT(floor, 0.0);
  for (const model::ParamSpec& s : gpu->layout().specs()) {
    double diff = 0, norm = 0;
    for (int64_t i = s.offset; i < s.offset + s.numel; ++i)
      diff += (double(g[i]) - ref[i]) * (double(g[i]) - ref[i]), norm += double(ref[i]) * ref[i];
    const double err = std::sqrt(diff) / std::max(std::sqrt(norm), floor);
    EXPECT_LE(err, kGradRelTol) << s.name;  // NaN fails
  }

  // The device gradient buffer holds the same values at flat_offsets().
  const std::vector<double> flat = download_f64(gpu->grads());
  for (size_t t = 0; t < gpu->layout().specs().size(); ++t) {
    const model::ParamSpec& s = gpu->layout().specs()[t];
    for (int64_t i = 0; i < s.numel; i += 97)
      ASSERT_EQ(flat[gpu->flat_offsets()[t] + i], double(g[s.offset + i])) << s.name << " element " << i;
  }
}

TEST_P(GpuPolicy, MatchesCpuF64OnABatchOfSeveralLengths) {
  RT_REQUIRE_GPU();
  std::mt19937_64 rng(testing::fresh_seed());
  const ModelConfig c = gpu_config(GetParam().arch, GetParam().tied);
  const std::vector<float> params = gpu_params(c, rng);
  const TokenBatch batch{{testing::random_ids(37, c.vocab, rng), testing::random_ids(70, c.vocab, rng),
                          testing::random_ids(5, c.vocab, rng)}};
  expect_matches_cpu_f64(c, params, batch, gpu_options(), rng);
}

// Packed: one token (no logprob), odd lengths and the longest in the middle, in one row.
TokenBatch packed_mixed_lengths(const ModelConfig& c, std::mt19937_64& rng) {
  TokenBatch batch{{testing::random_ids(7, c.vocab, rng), testing::random_ids(1, c.vocab, rng),
                    testing::random_ids(130, c.vocab, rng), testing::random_ids(33, c.vocab, rng),
                    testing::random_ids(64, c.vocab, rng)}};
  batch.packed = true;
  return batch;
}

TEST_P(GpuPolicy, PackedMatchesCpuF64) {
  RT_REQUIRE_GPU();
  std::mt19937_64 rng(testing::fresh_seed());
  const ModelConfig c = gpu_config(GetParam().arch, GetParam().tied);
  const std::vector<float> params = gpu_params(c, rng);
  expect_matches_cpu_f64(c, params, packed_mixed_lengths(c, rng), gpu_options(), rng);
}

INSTANTIATE_TEST_SUITE_P(Arch, GpuPolicy,
                         ::testing::Values(Variant{"qwen3_tied", Arch::Qwen3, true},
                                           Variant{"qwen2_bias", Arch::Qwen2, false},
                                           Variant{"llama", Arch::Llama, false}));

// What the model's packed attention asks for on packed_mixed_lengths' batch (its longest sequence: 130 tokens).
attention::AttnParams packed_call_params(const ModelConfig& c, const TokenBatch& batch) {
  attention::AttnParams p;
  p.device = Device::cuda(0);
  p.dtype = DType::BF16;
  p.batch = static_cast<int64_t>(batch.sequences.size());
  p.heads_q = c.heads, p.heads_kv = c.kv_heads, p.head_dim = c.head_dim;
  p.seqlen_q = p.seqlen_kv = 130;
  p.mask = attention::MaskType::CausalTopLeft;
  p.packed = true;
  return p;
}

// The packed batch through each GPU attention backend alone (the model's allow-list): one packed call per layer
// and direction, on that backend. A backend that cannot serve these params on this GPU skips with its reason.
class GpuPolicyPackedBackend : public ::testing::TestWithParam<attention::BackendId> {};

TEST_P(GpuPolicyPackedBackend, MatchesCpuF64) {
  RT_REQUIRE_GPU();
  const attention::BackendId id = GetParam();
  std::mt19937_64 rng(testing::fresh_seed());
  const ModelConfig c = gpu_config(Arch::Qwen2, false);
  const std::vector<float> params = gpu_params(c, rng);
  const TokenBatch batch = packed_mixed_lengths(c, rng);

  const attention::AttnParams p = packed_call_params(c, batch);
  {
    attention::BackendScope only("test", {id});
    const attention::Selection sel = attention::explain(p);
    if (sel.backend == nullptr) GTEST_SKIP() << sel.report();
  }

  PolicyOptions o = gpu_options();
  o.model.attention_backends = {id};
  attention::reset_dispatch_counts();
  expect_matches_cpu_f64(c, params, batch, o, rng);
  const attention::DispatchCounts n = attention::dispatch_counts();
  const int gpu = static_cast<int>(id), math = static_cast<int>(attention::BackendId::Math);
  EXPECT_EQ(n.forward[gpu], c.layers) << attention::format_dispatch_counts(n);
  EXPECT_EQ(n.backward[gpu], c.layers) << attention::format_dispatch_counts(n);
  // Besides, only the CPU reference's math calls: one per layer and direction.
  EXPECT_EQ(n.total(), 2 * c.layers + n.forward[math] + n.backward[math]) << attention::format_dispatch_counts(n);
}

// Under the default order, scoring (no backward) and a training forward with its backward both run on flash at head
// dim 64, where its forward and its forward+backward are the faster ones (attention/selection.h).
TEST(GpuPolicySelection, ScoringAndTrainingTakeTheHeadDimsOrder) {
  RT_REQUIRE_GPU();
  if (std::getenv("RINGTRAIN_SDPA_BACKENDS")) GTEST_SKIP() << "RINGTRAIN_SDPA_BACKENDS sets the order explicitly";
  attention::reset_root_backends();
  std::mt19937_64 rng(testing::fresh_seed());
  const ModelConfig c = gpu_config(Arch::Llama, false);
  const TokenBatch batch = packed_mixed_lengths(c, rng);
  std::unique_ptr<Policy> gpu = model::make_policy(c, gpu_params(c, rng), gpu_options());
  const attention::AttnParams p = packed_call_params(c, batch);
  const attention::Selection training = attention::explain(p);
  ASSERT_NE(training.backend, nullptr) << training.report();
  attention::BackendId scoring_id;
  {
    const attention::BackendScope no_backward = attention::BackendScope::forward_only();
    const attention::Selection scoring = attention::explain(p);
    ASSERT_NE(scoring.backend, nullptr) << scoring.report();
    scoring_id = scoring.backend->id();
  }
  const int fwd = static_cast<int>(scoring_id), train = static_cast<int>(training.backend->id());

  attention::reset_dispatch_counts();
  gpu->score(batch, /*for_backward=*/false, /*with_entropy=*/false);
  attention::DispatchCounts n = attention::dispatch_counts();
  EXPECT_EQ(n.forward[fwd], c.layers) << attention::format_dispatch_counts(n);
  EXPECT_EQ(n.total(), c.layers) << attention::format_dispatch_counts(n);

  attention::reset_dispatch_counts();
  const model::TokenScores scores = gpu->score(batch, /*for_backward=*/true, /*with_entropy=*/false);
  std::vector<std::vector<float>> d(scores.logprobs.size());
  for (size_t b = 0; b < d.size(); ++b) d[b].assign(scores.logprobs[b].size(), 1.f);
  gpu->backward(d);
  n = attention::dispatch_counts();
  EXPECT_EQ(n.forward[train], c.layers) << attention::format_dispatch_counts(n);
  EXPECT_EQ(n.backward[train], c.layers) << attention::format_dispatch_counts(n);
  EXPECT_EQ(n.total(), 2 * c.layers) << attention::format_dispatch_counts(n);
  EXPECT_EQ(scoring_id, training.backend->id());
  EXPECT_EQ(training.backend->id(), attention::BackendId::Flash) << training.report();  // flash serves every Hopper GPU
}

INSTANTIATE_TEST_SUITE_P(Backends, GpuPolicyPackedBackend,
                         ::testing::Values(attention::BackendId::Flash, attention::BackendId::Cudnn,
                                           attention::BackendId::Efficient),
                         [](const auto& info) { return std::string(attention::backend_name(info.param)); });

// score_and_backward applies a token-local gradient inside the LM head instead of recomputing the logits in
// backward(): the same kernels on the same values, so its scores are bit for bit those of score() and its gradients
// those of backward() with that gradient, padded and packed, over several LM-head chunks. Only the order of the fp32
// atomic sums (norm weights, biases, embedding rows) may differ between any two backward passes: 1e-5 relative per
// tensor (fp32 reassociation over a few hundred terms is ~1e-6; a chunk's gradient applied at wrong rows, twice or
// not at all is an O(1) error).
TEST(GpuPolicyFused, ScoreAndBackwardEqualsScoreThenBackward) {
  RT_REQUIRE_GPU();
  std::mt19937_64 rng(testing::fresh_seed());
  const ModelConfig c = gpu_config(Arch::Qwen2, false);
  const auto policy = model::make_policy(c, gpu_params(c, rng), gpu_options());
  std::normal_distribution<double> nd;
  for (bool packed : {false, true}) {
    TokenBatch batch = packed_mixed_lengths(c, rng);
    batch.packed = packed;
    std::vector<std::vector<double>> weight;
    for (const auto& seq : batch.sequences) {
      weight.emplace_back(seq.size());
      for (double& x : weight.back()) x = nd(rng);
    }
    // depends on the token's logprob, as the clipped policy gradient's does
    const model::TokenGradient grad = [&](int64_t b, int64_t p, float lp) { return weight[b][p] * std::exp(lp / 4); };
    int64_t calls = 0;
    policy->zero_grads();
    const model::TokenScores fused =
        policy->score_and_backward(batch, [&](int64_t b, int64_t p, float lp) { return ++calls, grad(b, p, lp); }, true);
    const std::vector<float> fused_grads = policy->grads_by_layout();

    policy->zero_grads();
    const model::TokenScores two = policy->score(batch, true, true);
    std::vector<std::vector<float>> d(two.logprobs.size());
    for (size_t b = 0; b < d.size(); ++b) {
      d[b].assign(two.logprobs[b].size(), 0.f);
      for (size_t p = 1; p < d[b].size(); ++p) d[b][p] = static_cast<float>(grad(b, p, two.logprobs[b][p]));
    }
    policy->backward(d);
    const std::vector<float> two_grads = policy->grads_by_layout();

    int64_t scored = 0;
    for (const auto& seq : batch.sequences) scored += static_cast<int64_t>(seq.size()) - 1;
    EXPECT_EQ(calls, scored) << "packed " << packed;
    EXPECT_EQ(fused.logprobs, two.logprobs) << "packed " << packed;
    EXPECT_EQ(fused.entropy, two.entropy) << "packed " << packed;
    ASSERT_EQ(fused_grads.size(), two_grads.size());
    double all = 0;
    for (float x : two_grads) all += double(x) * x;
    ASSERT_GT(all, 0.0);
    double worst = 0;
    for (const model::ParamSpec& spec : policy->layout().specs()) {
      double diff = 0, norm = 0;
      for (int64_t i = spec.offset; i < spec.offset + spec.numel; ++i) {
        const double d = double(fused_grads[i]) - two_grads[i];
        diff += d * d, norm += double(two_grads[i]) * two_grads[i];
      }
      const double err = std::sqrt(diff) / std::max(std::sqrt(norm), 1e-6 * std::sqrt(all));
      EXPECT_LE(err, 1e-5) << "packed " << packed << " " << spec.name;  // NaN fails
      worst = std::max(worst, err);
    }
    std::printf("[fused vs two calls] packed %d: worst relative gradient difference %.3g\n", int(packed), worst);
  }
}

// sum_grad_squares_in_next_backward: after two microbatches (the request made before the second's forward, the second's
// backward the fused one), the device sum equals the fp64 host sum of squares of grads_by_layout(), i.e. every tensor's
// gradient once (tied and untied LM heads, with and without biases in the summed vectors). Both are fp64 sums of the
// same ~10^6 fp32 squares (exact in fp64), the host's compensated (error ~1e-16 of the sum), the device's by threads
// and trees with at most ~64 roundings along any path (~1e-14): relative difference ≤ 1e-12, while the smallest range
// the device sums, the norm weights and biases, holds more than 1e-10 of the sum (checked, so that its omission would
// fail). A request is used by one backward only, and zero_grads() withdraws it: the NaN-poisoned result is then left as
// it was.
TEST(GpuPolicyBuffers, GradSquaresBesideTheLastBackwardEqualTheHostSum) {
  RT_REQUIRE_GPU();
  std::mt19937_64 rng(testing::fresh_seed());
  std::normal_distribution<double> nd;
  for (auto [arch, tied] : {std::pair{Arch::Llama, true}, std::pair{Arch::Qwen2, false}}) {
    const ModelConfig c = gpu_config(arch, tied);
    const auto policy = model::make_policy(c, gpu_params(c, rng), gpu_options());
    const std::string what = std::string(arch == Arch::Llama ? "llama" : "qwen2") + (tied ? " tied" : " untied");
    const Tensor result = Tensor::empty({1}, DType::F64, Device::cuda(0));
    const auto poison = [&] { fill(result.view(), std::nan("")); };
    const auto sum_on_device = [&] { return download_f64(result.view())[0]; };
    const TokenBatch first = packed_mixed_lengths(c, rng), second{{testing::random_ids(37, c.vocab, rng)}};
    const auto backward_of = [&](const TokenBatch& b) {
      const model::TokenScores sc = policy->score(b, true);
      std::vector<std::vector<float>> d(sc.logprobs.size());
      for (size_t i = 0; i < d.size(); ++i) {
        d[i].assign(sc.logprobs[i].size(), 0.f);
        for (size_t p = 1; p < d[i].size(); ++p) d[i][p] = static_cast<float>(nd(rng));
      }
      policy->backward(d);
    };

    policy->zero_grads();
    backward_of(first);
    poison();
    ASSERT_TRUE(policy->sum_grad_squares_in_next_backward(result.ptr<double>())) << what;
    policy->score_and_backward(second, [&](int64_t, int64_t, float lp) { return std::exp(lp / 4) - 0.5; }, false);
    const double got = sum_on_device();
    const std::vector<float> grads = policy->grads_by_layout();
    double want = 0, carry = 0, vectors = 0;  // Neumaier's compensated sum: exact squares, error ~1e-16 of the sum
    for (float g : grads) {
      const double x = double(g) * g, t = want + x;
      carry += want >= x ? (want - t) + x : (x - t) + want;
      want = t;
    }
    want += carry;
    for (const model::ParamSpec& spec : policy->layout().specs())
      if (spec.name.ends_with("norm.weight") || spec.name.ends_with(".bias"))
        for (int64_t i = spec.offset; i < spec.offset + spec.numel; ++i) vectors += double(grads[i]) * grads[i];
    ASSERT_GT(vectors, 1e-10 * want) << what;
    EXPECT_LE(std::abs(got - want), 1e-12 * want) << what << ": device " << got << ", host " << want;  // NaN fails
    std::printf("[grad squares beside the backward] %s: %.17g, host %.17g (norm weights and biases %.3g of it)\n",
                what.c_str(), got, want, vectors / want);

    poison();
    backward_of(first);  // the request was used
    EXPECT_TRUE(std::isnan(sum_on_device())) << what << ": a second backward wrote the result";
    ASSERT_TRUE(policy->sum_grad_squares_in_next_backward(result.ptr<double>())) << what;
    policy->zero_grads();
    backward_of(first);
    EXPECT_TRUE(std::isnan(sum_on_device())) << what << ": zero_grads() did not withdraw the request";
  }
}

// score_into over an int64 id view on the GPU (column stride 2, the sequences in a permuted order of rows, one row
// unused, ids outside the vocabulary past each length): the very scores of score() (the same layout through the same
// kernels) at [row, p] for 1 <= p < length, and every other entry of the NaN-poisoned results left as it was. Ids on
// the host with results on the GPU (the host fallback) give the same. A bad id is an error naming row and position.
TEST(GpuPolicyRows, ScoreIntoReadsGpuIdsInPlaceAndEqualsScore) {
  RT_REQUIRE_GPU();
  std::mt19937_64 rng(testing::fresh_seed());
  const ModelConfig c = gpu_config(Arch::Qwen2, false);
  const auto policy = model::make_policy(c, gpu_params(c, rng), gpu_options());
  for (const bool packed : {false, true}) {
    TokenBatch batch = packed_mixed_lengths(c, rng);
    batch.packed = packed;
    const model::TokenScores want = policy->score(batch, false, true);
    const auto B = static_cast<int64_t>(batch.sequences.size()), R = B + 1;
    int64_t C = 0;
    for (const auto& seq : batch.sequences) C = std::max(C, static_cast<int64_t>(seq.size()) + 2);
    std::vector<int64_t> order(static_cast<size_t>(R));
    for (int64_t r = 0; r < R; ++r) order[static_cast<size_t>(r)] = r;
    std::shuffle(order.begin(), order.end(), rng);  // sequence i at row order[i]; row order[B] unused
    Tensor host_ids = Tensor::empty({R, 2 * C}, DType::I64);
    for (int64_t i = 0; i < R * 2 * C; ++i) host_ids.ptr<int64_t>()[i] = c.vocab + 11;
    model::TokenRows rows;
    rows.packed = packed;
    for (int64_t i = 0; i < B; ++i) {
      const auto& seq = batch.sequences[static_cast<size_t>(i)];
      const int64_t r = order[static_cast<size_t>(i)];
      for (size_t p = 0; p < seq.size(); ++p) host_ids.ptr<int64_t>()[r * 2 * C + 2 * static_cast<int64_t>(p)] = seq[p];
      rows.rows.push_back(r);
      rows.lengths.push_back(static_cast<int64_t>(seq.size()));
    }
    Tensor dev_ids = Tensor::empty({R, 2 * C}, DType::I64, Device::cuda(0));
    copy(dev_ids, host_ids);
    const auto every_other_column = [&](const TensorView& v) {
      TensorView out = v;
      out.shape = {R, C, 0, 0};
      out.stride = {2 * C, 2, 0, 0};
      return out;
    };
    for (const bool ids_on_gpu : {true, false}) {
      rows.ids = every_other_column(ids_on_gpu ? dev_ids.view() : host_ids.view());
      Tensor lp = Tensor::empty({R, C}, DType::F32, Device::cuda(0));
      Tensor ent = Tensor::empty({R, C}, DType::F32, Device::cuda(0));
      fill(lp, NAN), fill(ent, NAN);
      policy->score_into(rows, lp, ent);
      Tensor lp_host = Tensor::empty({R, C}, DType::F32), ent_host = Tensor::empty({R, C}, DType::F32);
      copy(lp_host, lp), copy(ent_host, ent);
      std::vector<bool> written(static_cast<size_t>(R * C), false);
      for (int64_t i = 0; i < B; ++i) {
        const int64_t r = order[static_cast<size_t>(i)];
        for (int64_t p = 1; p < rows.lengths[static_cast<size_t>(i)]; ++p) {
          written[static_cast<size_t>(r * C + p)] = true;
          ASSERT_EQ(lp_host.ptr<float>()[r * C + p], want.logprobs[static_cast<size_t>(i)][static_cast<size_t>(p)])
              << "packed " << packed << " gpu ids " << ids_on_gpu << " sequence " << i << " position " << p;
          ASSERT_EQ(ent_host.ptr<float>()[r * C + p], want.entropy[static_cast<size_t>(i)][static_cast<size_t>(p)])
              << "packed " << packed << " gpu ids " << ids_on_gpu << " sequence " << i << " position " << p;
        }
      }
      for (int64_t k = 0; k < R * C; ++k)
        if (!written[static_cast<size_t>(k)]) {
          ASSERT_TRUE(std::isnan(lp_host.ptr<float>()[k])) << "entry " << k << " written";
          ASSERT_TRUE(std::isnan(ent_host.ptr<float>()[k])) << "entry " << k << " written";
        }
    }
    rows.ids = every_other_column(dev_ids.view());
    const int64_t r = rows.rows[1];
    const int64_t saved = host_ids.ptr<int64_t>()[r * 2 * C];  // position 0: inside every sequence
    host_ids.ptr<int64_t>()[r * 2 * C] = c.vocab;
    copy(dev_ids, host_ids);
    Tensor lp = Tensor::zeros({R, C}, DType::F32, Device::cuda(0));
    try {
      policy->score_into(rows, lp, {});
      ADD_FAILURE() << "a token id outside the vocabulary was scored";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(cat("token id ", c.vocab, " at position 0 of row ", r)), std::string::npos)
          << e.what();
    }
    host_ids.ptr<int64_t>()[r * 2 * C] = saved;
  }
}

TEST(GpuPolicyBuffers, ZeroGradsAndParamsRoundTrip) {
  RT_REQUIRE_GPU();
  std::mt19937_64 rng(testing::fresh_seed());
  const ModelConfig c = gpu_config(Arch::Llama, false);
  const auto policy = model::make_policy(c, gpu_params(c, rng), gpu_options());
  const TokenBatch batch{{testing::random_ids(20, c.vocab, rng)}};
  policy->score(batch, true);
  policy->backward({std::vector<float>(20, 1.f)});
  // zero_grads() marks the gradients zero without a pass; the buffer an optimizer reads must hold zeros.
  policy->zero_grads();
  for (double x : download_f64(policy->grads())) ASSERT_EQ(x, 0.0);
  for (float x : policy->grads_by_layout()) ASSERT_EQ(x, 0.f);

  const std::vector<float> values = gpu_params(c, rng);  // exact in bf16
  policy->set_params(values);
  EXPECT_EQ(policy->params(), values);
  const TensorView w = policy->weights();
  EXPECT_EQ(w.dtype, DType::BF16);
  const std::vector<double> flat = download_f64(w);
  const model::ParamSpec& s = policy->layout().specs().back();
  EXPECT_EQ(flat[policy->flat_offsets().back()], double(values[s.offset])) << s.name;
  EXPECT_THROW(policy->grad("no.such.weight"), Error);
}

}  // namespace
}  // namespace ringtrain
