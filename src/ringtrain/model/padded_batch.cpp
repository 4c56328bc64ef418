#include "ringtrain/model/padded_batch.h"

#include <algorithm>
#include <limits>

#include "ringtrain/core/error.h"
#include "ringtrain/cp/zigzag.h"

namespace ringtrain::model {

PaddedBatch::PaddedBatch(const TokenBatch& batch, int64_t vocab, int cp, int rank) : cp_(cp), rank_(rank) {
  RT_CHECK(!batch.sequences.empty(), "policy: empty batch");
  RT_CHECK(cp >= 1 && rank >= 0 && rank < cp, "policy: rank ", rank, " of a cp group of ", cp);
  for (size_t b = 0; b < batch.sequences.size(); ++b) {
    const std::vector<int32_t>& seq = batch.sequences[b];
    RT_CHECK(!seq.empty(), "policy: sequence ", b, " of the batch is empty");
    for (size_t p = 0; p < seq.size(); ++p)
      RT_CHECK(seq[p] >= 0 && seq[p] < vocab, "policy: token id ", seq[p], " at position ", p, " of sequence ", b,
               " is outside the vocabulary [0, ", vocab, ")");
    lengths_.push_back(static_cast<int64_t>(seq.size()));
    max_len_ = std::max(max_len_, lengths_.back());
  }
  RT_CHECK(max_len_ < std::numeric_limits<int32_t>::max() / 2, "policy: a sequence of ", max_len_,
           " tokens is too long");
  rows_ = cp == 1 ? max_len_ : cp::ZigzagLayout(cp, rank, max_len_).local_len();
  const int64_t B = sequences();
  RT_CHECK(rows_ <= std::numeric_limits<int64_t>::max() / B, "policy: ", B, " sequences of ", rows_, " rows");
  tokens_.assign(static_cast<size_t>(B * rows_), 0);
  positions_.assign(tokens_.size(), 0);
  targets_.assign(tokens_.size(), -1);
  for (int64_t b = 0; b < B; ++b) {
    const std::vector<int32_t>& seq = batch.sequences[static_cast<size_t>(b)];
    for (int64_t i = 0; i < rows_; ++i) {
      const int64_t g = global_index(rank, i), row = b * rows_ + i;
      positions_[row] = static_cast<int32_t>(g);
      if (g < lengths_[b]) tokens_[row] = seq[g];
      if (g + 1 < lengths_[b]) targets_[row] = seq[g + 1];
    }
  }
}

int64_t PaddedBatch::global_index(int rank, int64_t row) const {
  return cp_ == 1 ? row : cp::ZigzagLayout(cp_, rank, max_len_).global_index(row);
}

template <typename T>
std::vector<std::vector<float>> PaddedBatch::to_tokens(const T* gathered, int64_t block_stride) const {
  const int64_t B = sequences();
  std::vector<std::vector<float>> out(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) out[b].assign(static_cast<size_t>(lengths_[b]), 0.f);
  for (int r = 0; r < cp_; ++r) {
    const T* block = gathered + r * block_stride;
    for (int64_t i = 0; i < rows_; ++i) {
      const int64_t g = global_index(r, i);  // row g scores token g + 1
      for (int64_t b = 0; b < B; ++b)
        if (g + 1 < lengths_[b]) out[b][g + 1] = static_cast<float>(block[b * rows_ + i]);
    }
  }
  return out;
}

template <typename T>
std::vector<T> PaddedBatch::row_grads(const std::vector<std::vector<float>>& d_logprobs) const {
  const int64_t B = sequences();
  RT_CHECK(static_cast<int64_t>(d_logprobs.size()) == B, "policy backward: ", d_logprobs.size(),
           " gradient sequences for a batch of ", B);
  for (int64_t b = 0; b < B; ++b)
    RT_CHECK(static_cast<int64_t>(d_logprobs[b].size()) == lengths_[b], "policy backward: ", d_logprobs[b].size(),
             " gradients for sequence ", b, " of ", lengths_[b], " tokens");
  std::vector<T> d_rows(static_cast<size_t>(B * rows_), T(0));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < rows_; ++i) {
      const int64_t g = global_index(rank_, i);
      if (g + 1 < lengths_[b]) d_rows[b * rows_ + i] = static_cast<T>(d_logprobs[b][g + 1]);
    }
  return d_rows;
}

#define RT_INSTANTIATE(T)                                                                                  \
  template std::vector<std::vector<float>> PaddedBatch::to_tokens<T>(const T*, int64_t) const;            \
  template std::vector<T> PaddedBatch::row_grads<T>(const std::vector<std::vector<float>>&) const;
RT_INSTANTIATE(float)
RT_INSTANTIATE(double)
#undef RT_INSTANTIATE

}  // namespace ringtrain::model
