// Token log-probabilities from final hidden states: log_softmax(h · W_lm^T)[target] in the model's float type
// (fp32 for real use), computed in chunks of tokens so that at most [chunk x vocab] logits exist at a time,
// and the backward of a loss given d(loss)/d(logprob), chunked the same way (logits are recomputed).
#pragma once

#include <cstdint>
#include <vector>

#include "ringtrain/model/model.h"

namespace ringtrain::model {

constexpr int64_t kDefaultLogprobChunk = 1024;

// Turns logits [m, vocab] into log-softmax in place. With `entropy` (optional, [m]), entropy[r] = the entropy of
// row r's distribution, from the same pass.
template <typename T>
void log_softmax_rows(T* logits, int64_t m, int64_t vocab, T* entropy = nullptr);

// out[i] = log P(targets[i] | row i) for rows [n, hidden_dim]; 0 where targets[i] < 0 (no next token). With
// `entropy` (optional, [n]), entropy[i] = the entropy of row i's whole distribution, from the same pass.
template <typename T>
void token_logprobs(T* out, const T* hidden, const T* lm_head, const int32_t* targets, int64_t n,
                    int64_t hidden_dim, int64_t vocab, int64_t chunk_tokens, T* entropy = nullptr);
// Adds d(loss)/d(hidden) into d_hidden and d(loss)/d(lm_head) into d_lm_head, given d_logprobs [n].
template <typename T>
void token_logprobs_backward(T* d_hidden, T* d_lm_head, const T* d_logprobs, const T* hidden, const T* lm_head,
                             const int32_t* targets, int64_t n, int64_t hidden_dim, int64_t vocab,
                             int64_t chunk_tokens);

// Whole model, per row: runs forward and returns log P(targets[i] | tokens up to row i) for [batch * seqlen]
// rows (this rank's rows under CP: positions and targets say where each row is in its sequence).
template <typename T>
std::vector<T> model_row_logprobs(Model<T>& model, const int32_t* tokens, const int32_t* positions,
                                  const int32_t* targets, int64_t batch, int64_t seqlen, SequenceAttention& attention,
                                  int64_t chunk_tokens, bool for_backward);
// After model_row_logprobs(..., for_backward = true): adds every weight gradient of a loss with
// d(loss)/d(row logprob) = d_rows.
template <typename T>
void model_row_logprobs_backward(Model<T>& model, const int32_t* targets, const T* d_rows,
                                 SequenceAttention& attention, int64_t chunk_tokens);

// Row i of a whole sequence scores token i + 1: targets ids[i + 1], -1 for the last row; positions 0..n-1.
std::vector<int32_t> next_token_targets(const std::vector<int32_t>& ids);
std::vector<int32_t> iota_positions(size_t n);

// One sequence on one rank, in token order: result[0] = 0, result[p] = log P(ids[p] | ids[<p]).
template <typename T>
std::vector<T> sequence_logprobs(Model<T>& model, const std::vector<int32_t>& ids, SequenceAttention& attention,
                                 int64_t chunk_tokens, bool for_backward = false);
// After sequence_logprobs(..., true): gradient of a loss given d(loss)/d(result[p]) in token order.
template <typename T>
void sequence_logprobs_backward(Model<T>& model, const std::vector<int32_t>& ids, const std::vector<T>& d_logprobs,
                                SequenceAttention& attention, int64_t chunk_tokens);

}  // namespace ringtrain::model
