// The model with sliding windows (Mistral: every layer; Qwen2: the layers max_window_layers / layer_types name)
// against an independent reference: a SequenceAttention that ignores the window the model passes and runs the CPU
// math backend without a mask, with a dense fp64 additive bias of -inf wherever the test's own per-layer windows
// (written out here, not read from the config) hide a key. fp64 throughout, so both sides agree to rounding; the
// unwindowed model differs by O(0.1) on these sequences, longer than the window.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "model_test_util.h"
#include "ringtrain/attention/cpu/cpu_backends.h"
#include "ringtrain/attention/selection.h"
#include "ringtrain/core/error.h"
#include "ringtrain/model/generate.h"
#include "ringtrain/model/logprobs.h"
#include "ringtrain/model/policy.h"
#include "test_util.h"

namespace ringtrain {
namespace {

using attention::BackendId;
using model::Arch;
using model::Model;
using model::ModelConfig;
using model::TokenBatch;
using nlohmann::json;

constexpr int64_t kWindow = 4;

// Causal attention with the window windows[l] (0: none) in the l-th call of each pass over the layers, through an
// additive bias on an unmasked math call.
class DenseMaskAttention final : public model::SequenceAttention {
 public:
  explicit DenseMaskAttention(std::vector<int64_t> windows) : windows_(std::move(windows)) {}
  int64_t total_seqlen(int64_t local_seqlen) const override { return local_seqlen; }
  void forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
               const TensorView& lse, int64_t) override {
    attention::AttnForwardArgs a;
    a.q = q, a.k = k, a.v = v, a.o = o, a.lse = lse, a.bias = bias(q.shape[1], next_window(forward_calls_++));
    attention::forward(params(q, k), a);
  }
  void backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                const TensorView& dout, const TensorView& lse, const TensorView& dq, const TensorView& dk,
                const TensorView& dv, int64_t) override {
    // The backward walks the layers last to first.
    const int64_t layer = static_cast<int64_t>(windows_.size()) - 1 - (backward_calls_++ % windows_.size());
    attention::AttnBackwardArgs a;
    a.q = q, a.k = k, a.v = v, a.o = o, a.dout = dout, a.lse = lse, a.dq = dq, a.dk = dk, a.dv = dv;
    a.bias = bias(q.shape[1], windows_[static_cast<size_t>(layer)]);
    attention::backward(params(q, k), a);
  }

 private:
  int64_t next_window(int64_t call) const { return windows_[static_cast<size_t>(call) % windows_.size()]; }
  static attention::AttnParams params(const TensorView& q, const TensorView& k) {
    attention::AttnParams p = attention::params_for(q, k, attention::MaskType::None);
    p.has_bias = true;
    return p;
  }
  // [1, 1, S, S]: key j hidden from query i when j > i or i - j >= w.
  TensorView bias(int64_t s, int64_t w) {
    bias_.assign(static_cast<size_t>(s * s), 0.0);
    for (int64_t i = 0; i < s; ++i)
      for (int64_t j = 0; j < s; ++j)
        if (j > i || (w > 0 && i - j >= w)) bias_[i * s + j] = -std::numeric_limits<double>::infinity();
    return contiguous_view(bias_.data(), DType::F64, Device::cpu(), {1, 1, s, s});
  }

  std::vector<int64_t> windows_;
  std::vector<double> bias_;
  int64_t forward_calls_ = 0, backward_calls_ = 0;
};

struct Case {
  const char* name;
  Arch arch;
  json keys;                     // added to the tiny config's config.json
  std::vector<int64_t> windows;  // what transformers applies per layer
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

ModelConfig parsed(const Case& k) {
  json j = model::config_to_json(testing::tiny_config(k.arch, false, static_cast<int64_t>(k.windows.size())));
  for (const auto& [key, value] : k.keys.items()) j[key] = value;
  return model::parse_config(j, k.name);
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

class WindowedModel : public ::testing::TestWithParam<Case> {};

TEST_P(WindowedModel, MatchesDenseMaskReferenceFp64) {
  attention::cpu::set_math_fp64(true);
  std::mt19937_64 rng(testing::fresh_seed());
  const ModelConfig c = parsed(GetParam());
  for (int64_t l = 0; l < c.layers; ++l) ASSERT_EQ(c.layer_window(l), GetParam().windows[l]) << "layer " << l;
  model::ModelOptions opts;
  opts.attention_backends = {BackendId::Math};
  const std::vector<float> params = testing::tiny_params(c, rng);
  const std::vector<int32_t> ids = testing::random_ids(13, c.vocab, rng);
  std::vector<double> r(ids.size());
  std::normal_distribution<double> nd;
  for (double& x : r) x = nd(rng);

  auto run = [&](ModelConfig config, model::SequenceAttention& attn, std::vector<double>* grads) {
    Model<double> m(std::move(config), params, opts);
    m.zero_grads();
    std::vector<double> lp = model::sequence_logprobs(m, ids, attn, 4, /*for_backward=*/true);
    model::sequence_logprobs_backward(m, ids, r, attn, 4);
    *grads = m.grads();
    return lp;
  };
  std::vector<double> g_model, g_ref, g_full;
  auto local = model::make_local_attention();
  DenseMaskAttention reference(GetParam().windows);
  const std::vector<double> lp_model = run(c, *local, &g_model);
  const std::vector<double> lp_ref = run(c, reference, &g_ref);
  ModelConfig unwindowed = c;
  unwindowed.sliding_window = 0, unwindowed.full_attention_layers.clear();
  const std::vector<double> lp_full = run(unwindowed, *local, &g_full);

  EXPECT_LE(max_abs_diff(lp_model, lp_ref), 1e-12);
  EXPECT_LE(max_abs_diff(g_model, g_ref), 1e-10);
  EXPECT_GT(max_abs_diff(lp_model, lp_full), 1e-3) << "the window changed nothing";
  // Before the window first hides a key (positions < w) the two models agree.
  for (int64_t p = 1; p < kWindow; ++p) EXPECT_NEAR(lp_model[p], lp_full[p], 1e-12) << "position " << p;
}

INSTANTIATE_TEST_SUITE_P(
    Arch, WindowedModel,
    ::testing::Values(Case{"mistral", Arch::Mistral, {{"sliding_window", kWindow}}, {kWindow, kWindow}},
                      // transformers windows the layers from max_window_layers on.
                      Case{"qwen2_max_window_layers",
                           Arch::Qwen2,
                           {{"sliding_window", kWindow}, {"use_sliding_window", true}, {"max_window_layers", 1}},
                           {0, kWindow, kWindow}},
                      Case{"qwen2_layer_types",
                           Arch::Qwen2,
                           {{"sliding_window", kWindow},
                            {"use_sliding_window", true},
                            {"max_window_layers", 3},
                            {"layer_types", {"sliding_attention", "full_attention", "sliding_attention"}}},
                           {kWindow, 0, kWindow}}),
    [](const auto& info) { return std::string(info.param.name); });

model::PolicyOptions f64_options() {
  model::PolicyOptions o;
  o.dtype = DType::F64;
  return o;
}

// Packed documents (positions restarting at 0, one THD call per layer) and a padded batch, each longer than the
// window, give each document what it gets scored alone, gradients included.
TEST(WindowedPolicy, PackedAndPaddedEqualEachDocumentAlone) {
  std::mt19937_64 rng(testing::fresh_seed());
  const ModelConfig c = parsed({"qwen2", Arch::Qwen2,
                                {{"sliding_window", kWindow}, {"use_sliding_window", true}, {"max_window_layers", 1}},
                                {0, kWindow}});
  const std::vector<float> params = testing::tiny_params(c, rng);
  TokenBatch batch{{testing::random_ids(9, c.vocab, rng), testing::random_ids(3, c.vocab, rng),
                    testing::random_ids(12, c.vocab, rng)}};
  std::vector<std::vector<float>> w;
  std::normal_distribution<float> nd;
  for (const auto& s : batch.sequences) {
    w.emplace_back(s.size());
    for (float& x : w.back()) x = nd(rng);
  }
  const auto alone = model::make_policy(c, params, f64_options());
  alone->zero_grads();
  std::vector<std::vector<float>> want;
  for (size_t b = 0; b < batch.sequences.size(); ++b) {
    want.push_back(alone->score(TokenBatch{{batch.sequences[b]}}, true, false).logprobs[0]);
    alone->backward({w[b]});
  }
  const std::vector<float> want_grads = alone->grads_by_layout();
  for (bool packed : {true, false}) {
    batch.packed = packed;
    const auto together = model::make_policy(c, params, f64_options());
    together->zero_grads();
    const model::TokenScores got = together->score(batch, true, false);
    together->backward(w);
    for (size_t b = 0; b < batch.sequences.size(); ++b)
      for (size_t p = 0; p < want[b].size(); ++p)
        ASSERT_NEAR(got.logprobs[b][p], want[b][p], 3e-7) << (packed ? "packed" : "padded") << " doc " << b;
    const std::vector<float> g = together->grads_by_layout();
    for (size_t i = 0; i < g.size(); ++i)
      ASSERT_NEAR(g[i], want_grads[i], 1e-6 + 1e-6 * std::fabs(want_grads[i])) << (packed ? "packed" : "padded");
  }
}

// The CPU sampler's KV-cache attention applies each layer's window (a query at position t sees [t - w + 1, t]):
// the logprobs of tokens generated well past the window equal Policy::score of the finished sequences.
TEST(WindowedSampler, LogprobsEqualScore) {
  std::mt19937_64 rng(testing::fresh_seed());
  for (const Case& k : {Case{"mistral", Arch::Mistral, {{"sliding_window", kWindow}}, {kWindow, kWindow}},
                        Case{"qwen2",
                             Arch::Qwen2,
                             {{"sliding_window", kWindow}, {"use_sliding_window", true}, {"max_window_layers", 1}},
                             {0, kWindow}}}) {
    const ModelConfig c = parsed(k);
    model::PolicyOptions o;
    o.model.attention_backends = {BackendId::Math};
    const auto policy = model::make_policy(c, testing::tiny_params(c, rng), o);
    const std::vector<std::vector<int32_t>> prompts = {testing::random_ids(2, c.vocab, rng),
                                                       testing::random_ids(7, c.vocab, rng)};
    model::SamplingParams s;
    s.temperature = 1.0, s.max_new_tokens = 10, s.seed = rng();
    model::Sampler sampler(*policy);
    const std::vector<model::Generation> gens = sampler.generate(prompts, s);
    TokenBatch batch;
    for (size_t b = 0; b < prompts.size(); ++b) {
      batch.sequences.push_back(prompts[b]);
      batch.sequences.back().insert(batch.sequences.back().end(), gens[b].tokens.begin(), gens[b].tokens.end());
    }
    const model::TokenScores scored = policy->score(batch, false);
    ModelConfig unwindowed = c;
    unwindowed.sliding_window = 0, unwindowed.full_attention_layers.clear();
    const auto full = model::make_policy(unwindowed, policy->params(), o);
    const model::TokenScores scored_full = full->score(batch, false);
    double moved = 0;
    for (size_t b = 0; b < prompts.size(); ++b) {
      ASSERT_GT(batch.sequences[b].size(), static_cast<size_t>(kWindow + 2)) << k.name;
      for (size_t i = 0; i < gens[b].tokens.size(); ++i) {
        const size_t p = prompts[b].size() + i;
        ASSERT_NEAR(gens[b].logprobs[i], scored.logprobs[b][p], 1e-5) << k.name << " prompt " << b << " token " << i;
        moved = std::max(moved, std::fabs(static_cast<double>(scored_full.logprobs[b][p]) - scored.logprobs[b][p]));
      }
    }
    EXPECT_GT(moved, 1e-3) << k.name << ": the window changed nothing";
  }
}

}  // namespace
}  // namespace ringtrain
