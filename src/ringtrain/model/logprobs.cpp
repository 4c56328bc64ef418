#include "ringtrain/model/logprobs.h"

#include <algorithm>
#include <cmath>

#include "ringtrain/core/error.h"
#include "ringtrain/model/layers.h"

namespace ringtrain::model {
namespace {

void check_targets(const int32_t* targets, int64_t n, int64_t vocab) {
  for (int64_t i = 0; i < n; ++i)
    RT_CHECK(targets[i] < vocab, "logprobs: target token id ", targets[i], " at row ", i,
             " is outside the vocabulary [0, ", vocab, ")");
}

}  // namespace

// Sums in double: vocabularies are large. Entropy from the same pass: with e_v = exp(z_v - max),
// H = lse - sum_v p_v z_v = log(sum e) - sum(e (z - max)) / sum e.
template <typename T>
void log_softmax_rows(T* logits, int64_t m, int64_t vocab, T* entropy) {
  parallel_items(m, vocab, [&](int64_t r) {
    T* z = logits + r * vocab;
    const T mx = *std::max_element(z, z + vocab);
    double sum = 0, sum_ez = 0;
    for (int64_t v = 0; v < vocab; ++v) {
      const double shifted = static_cast<double>(z[v] - mx), e = std::exp(shifted);
      sum += e;
      if (entropy && e > 0) sum_ez += e * shifted;  // e = 0 at a -inf logit, whose term is 0
    }
    const T lse = mx + static_cast<T>(std::log(sum));
    if (entropy) entropy[r] = static_cast<T>(std::log(sum) - sum_ez / sum);
    for (int64_t v = 0; v < vocab; ++v) z[v] -= lse;
  });
}

template <typename T>
void token_logprobs(T* out, const T* hidden, const T* lm_head, const int32_t* targets, int64_t n,
                    int64_t hidden_dim, int64_t vocab, int64_t chunk_tokens, T* entropy) {
  RT_CHECK(chunk_tokens > 0, "logprobs: chunk size must be positive, got ", chunk_tokens);
  check_targets(targets, n, vocab);
  std::vector<T> logits(static_cast<size_t>(std::min(n, chunk_tokens) * vocab));
  for (int64_t c0 = 0; c0 < n; c0 += chunk_tokens) {
    const int64_t m = std::min(chunk_tokens, n - c0);
    linear_forward(logits.data(), hidden + c0 * hidden_dim, lm_head, static_cast<const T*>(nullptr), m, hidden_dim,
                   vocab);
    log_softmax_rows(logits.data(), m, vocab, entropy ? entropy + c0 : nullptr);
    for (int64_t r = 0; r < m; ++r) out[c0 + r] = targets[c0 + r] < 0 ? T(0) : logits[r * vocab + targets[c0 + r]];
  }
}

template <typename T>
void token_logprobs_backward(T* d_hidden, T* d_lm_head, const T* d_logprobs, const T* hidden, const T* lm_head,
                             const int32_t* targets, int64_t n, int64_t hidden_dim, int64_t vocab,
                             int64_t chunk_tokens) {
  RT_CHECK(chunk_tokens > 0, "logprobs: chunk size must be positive, got ", chunk_tokens);
  check_targets(targets, n, vocab);
  std::vector<T> dz(static_cast<size_t>(std::min(n, chunk_tokens) * vocab));
  for (int64_t c0 = 0; c0 < n; c0 += chunk_tokens) {
    const int64_t m = std::min(chunk_tokens, n - c0);
    linear_forward(dz.data(), hidden + c0 * hidden_dim, lm_head, static_cast<const T*>(nullptr), m, hidden_dim, vocab);
    log_softmax_rows(dz.data(), m, vocab);
    // d logp_t / d z_v = 1[v = t] - softmax_v
    parallel_items(m, vocab, [&](int64_t r) {
      T* z = dz.data() + r * vocab;
      const int32_t t = targets[c0 + r];
      const T g = t < 0 ? T(0) : d_logprobs[c0 + r];
      for (int64_t v = 0; v < vocab; ++v) z[v] = -g * std::exp(z[v]);
      if (t >= 0) z[t] += g;
    });
    linear_backward(d_hidden + c0 * hidden_dim, d_lm_head, static_cast<T*>(nullptr), dz.data(),
                    hidden + c0 * hidden_dim, lm_head, m, hidden_dim, vocab);
  }
}

template <typename T>
std::vector<T> model_row_logprobs(Model<T>& model, const int32_t* tokens, const int32_t* positions,
                                  const int32_t* targets, int64_t batch, int64_t seqlen, SequenceAttention& attention,
                                  int64_t chunk_tokens, bool for_backward) {
  const ModelConfig& c = model.config();
  const std::vector<T>& hidden = model.forward(tokens, positions, batch, seqlen, attention, for_backward);
  std::vector<T> out(static_cast<size_t>(batch * seqlen));
  token_logprobs(out.data(), hidden.data(), model.lm_head(), targets, batch * seqlen, c.hidden, c.vocab, chunk_tokens);
  return out;
}

template <typename T>
void model_row_logprobs_backward(Model<T>& model, const int32_t* targets, const T* d_rows,
                                 SequenceAttention& attention, int64_t chunk_tokens) {
  const ModelConfig& c = model.config();
  const std::vector<T>& hidden = model.hidden();
  const int64_t n = static_cast<int64_t>(hidden.size()) / c.hidden;
  std::vector<T> d_hidden(hidden.size(), T(0));
  token_logprobs_backward(d_hidden.data(), model.lm_head_grad(), d_rows, hidden.data(), model.lm_head(), targets, n,
                          c.hidden, c.vocab, chunk_tokens);
  model.backward(d_hidden.data(), attention);
}

std::vector<int32_t> next_token_targets(const std::vector<int32_t>& ids) {
  std::vector<int32_t> t(ids.size(), -1);
  for (size_t i = 0; i + 1 < ids.size(); ++i) t[i] = ids[i + 1];
  return t;
}

std::vector<int32_t> iota_positions(size_t n) {
  std::vector<int32_t> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>(i);
  return p;
}

template <typename T>
std::vector<T> sequence_logprobs(Model<T>& model, const std::vector<int32_t>& ids, SequenceAttention& attention,
                                 int64_t chunk_tokens, bool for_backward) {
  RT_CHECK(!ids.empty(), "logprobs: empty sequence");
  const std::vector<int32_t> targets = next_token_targets(ids), positions = iota_positions(ids.size());
  const int64_t S = static_cast<int64_t>(ids.size());
  const std::vector<T> rows = model_row_logprobs(model, ids.data(), positions.data(), targets.data(), 1, S, attention,
                                                 chunk_tokens, for_backward);
  std::vector<T> out(ids.size(), T(0));  // row i scores token i + 1
  for (int64_t i = 0; i + 1 < S; ++i) out[i + 1] = rows[i];
  return out;
}

template <typename T>
void sequence_logprobs_backward(Model<T>& model, const std::vector<int32_t>& ids, const std::vector<T>& d_logprobs,
                                SequenceAttention& attention, int64_t chunk_tokens) {
  RT_CHECK(d_logprobs.size() == ids.size(), "logprobs backward: ", d_logprobs.size(), " gradients for ", ids.size(),
           " tokens");
  const std::vector<int32_t> targets = next_token_targets(ids);
  std::vector<T> d_rows(ids.size(), T(0));
  for (size_t i = 0; i + 1 < ids.size(); ++i) d_rows[i] = d_logprobs[i + 1];
  model_row_logprobs_backward(model, targets.data(), d_rows.data(), attention, chunk_tokens);
}

#define RT_INSTANTIATE(T)                                                                                          \
  template void log_softmax_rows<T>(T*, int64_t, int64_t, T*);                                                     \
  template void token_logprobs<T>(T*, const T*, const T*, const int32_t*, int64_t, int64_t, int64_t, int64_t, T*); \
  template void token_logprobs_backward<T>(T*, T*, const T*, const T*, const T*, const int32_t*, int64_t, int64_t, \
                                           int64_t, int64_t);                                                      \
  template std::vector<T> model_row_logprobs<T>(Model<T>&, const int32_t*, const int32_t*, const int32_t*, int64_t, \
                                                int64_t, SequenceAttention&, int64_t, bool);                       \
  template void model_row_logprobs_backward<T>(Model<T>&, const int32_t*, const T*, SequenceAttention&, int64_t);  \
  template std::vector<T> sequence_logprobs<T>(Model<T>&, const std::vector<int32_t>&, SequenceAttention&, int64_t, \
                                               bool);                                                              \
  template void sequence_logprobs_backward<T>(Model<T>&, const std::vector<int32_t>&, const std::vector<T>&,       \
                                              SequenceAttention&, int64_t);
RT_INSTANTIATE(float)
RT_INSTANTIATE(double)
#undef RT_INSTANTIATE

}  // namespace ringtrain::model
