#include "ringtrain/model/batch_rows.h"

#include <algorithm>
#include <limits>

#include "ringtrain/core/error.h"
#include "ringtrain/cp/zigzag.h"
#include "ringtrain/model/cp_scoring.h"

namespace ringtrain::model {

BatchRows::BatchRows(const TokenBatch& batch, int64_t vocab, int cp, int rank)
    : packed_(batch.packed), cp_(cp), rank_(rank) {
  RT_CHECK(!batch.sequences.empty(), "policy: empty batch");
  RT_CHECK(cp >= 1 && rank >= 0 && rank < cp, "policy: rank ", rank, " of a cp group of ", cp);
  int64_t total = 0;
  for (size_t b = 0; b < batch.sequences.size(); ++b) {
    const std::vector<int32_t>& seq = batch.sequences[b];
    RT_CHECK(!seq.empty(), "policy: sequence ", b, " of the batch is empty");
    for (size_t p = 0; p < seq.size(); ++p)
      RT_CHECK(seq[p] >= 0 && seq[p] < vocab, "policy: token id ", seq[p], " at position ", p, " of sequence ", b,
               " is outside the vocabulary [0, ", vocab, ")");
    lengths_.push_back(static_cast<int64_t>(seq.size()));
    max_len_ = std::max(max_len_, lengths_.back());
    total += lengths_.back();
  }
  // Zigzag pads a sequence by less than 2 * cp tokens; a packed row's offsets (cu_seqlens) are int32.
  const int64_t limit = std::numeric_limits<int32_t>::max() / 2;
  RT_CHECK(max_len_ < limit, "policy: a sequence of ", max_len_, " tokens is too long");
  RT_CHECK(!packed_ || total < limit, "policy: a packed batch of ", total, " tokens is too long");
  const std::vector<Slot> mine = slots(rank);
  const int64_t n = static_cast<int64_t>(mine.size());
  row_len_ = packed_ ? n : n / sequences();
  tokens_.assign(static_cast<size_t>(n), 0);
  positions_.assign(tokens_.size(), 0);
  targets_.assign(tokens_.size(), -1);
  for (int64_t i = 0; i < n; ++i) {
    const auto [b, g] = mine[i];
    const std::vector<int32_t>& seq = batch.sequences[static_cast<size_t>(b)];
    positions_[i] = static_cast<int32_t>(g);
    if (g < lengths_[b]) tokens_[i] = seq[g];
    if (g + 1 < lengths_[b]) targets_[i] = seq[g + 1];
  }
}

std::vector<BatchRows::Slot> BatchRows::slots(int rank) const {
  std::vector<Slot> out;
  const int64_t B = sequences();
  if (!packed_) {
    const cp::ZigzagLayout row(cp_, rank, max_len_);
    const int64_t per_row = cp_ == 1 ? max_len_ : row.local_len();
    RT_CHECK(per_row <= std::numeric_limits<int64_t>::max() / B, "policy: ", B, " sequences of ", per_row, " rows");
    out.reserve(static_cast<size_t>(B * per_row));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < per_row; ++i) out.push_back({b, cp_ == 1 ? i : row.global_index(i)});
    return out;
  }
  if (cp_ == 1) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < lengths_[b]; ++i) out.push_back({b, i});
    return out;
  }
  const cp::PackedZigzag layout(cp_, rank, lengths_);
  out.reserve(static_cast<size_t>(layout.local_total()));
  for (int64_t b = 0; b < B; ++b) {
    const cp::ZigzagLayout doc = layout.doc(static_cast<size_t>(b));
    for (int64_t i = 0; i < doc.local_len(); ++i) out.push_back({b, doc.global_index(i)});
  }
  return out;
}

std::unique_ptr<SequenceAttention> BatchRows::attention(comm::Communicator* cp_group,
                                                        const cp::CpConfig& config) const {
  RT_CHECK(cp_group ? cp_group->size() == cp_ && cp_group->rank() == rank_ : cp_ == 1,
           "policy: rows laid out for rank ", rank_, " of ", cp_, " run on a cp group of ",
           cp_group ? cp_group->size() : 1);
  if (!cp_group) return packed_ ? make_packed_attention(lengths_) : make_local_attention();
  if (packed_) return make_cp_packed_attention(*cp_group, config, lengths_);
  return make_cp_attention(*cp_group, config, max_len_);
}

template <typename T>
std::vector<std::vector<float>> BatchRows::to_tokens(const T* gathered, int64_t block_stride) const {
  std::vector<std::vector<float>> out(lengths_.size());
  for (size_t b = 0; b < out.size(); ++b) out[b].assign(static_cast<size_t>(lengths_[b]), 0.f);
  for (int r = 0; r < cp_; ++r) {
    const T* block = gathered + r * block_stride;
    const std::vector<Slot> held = slots(r);
    for (size_t i = 0; i < held.size(); ++i) {
      const auto [b, g] = held[i];  // row g scores token g + 1
      if (g + 1 < lengths_[b]) out[b][g + 1] = static_cast<float>(block[i]);
    }
  }
  return out;
}

template <typename T>
std::vector<T> BatchRows::row_grads(const std::vector<std::vector<float>>& d_logprobs) const {
  const int64_t B = sequences();
  RT_CHECK(static_cast<int64_t>(d_logprobs.size()) == B, "policy backward: ", d_logprobs.size(),
           " gradient sequences for a batch of ", B);
  for (int64_t b = 0; b < B; ++b)
    RT_CHECK(static_cast<int64_t>(d_logprobs[b].size()) == lengths_[b], "policy backward: ", d_logprobs[b].size(),
             " gradients for sequence ", b, " of ", lengths_[b], " tokens");
  const std::vector<Slot> mine = slots(rank_);
  std::vector<T> d_rows(mine.size(), T(0));
  for (size_t i = 0; i < mine.size(); ++i) {
    const auto [b, g] = mine[i];
    if (g + 1 < lengths_[b]) d_rows[i] = static_cast<T>(d_logprobs[b][g + 1]);
  }
  return d_rows;
}

std::vector<BatchRows::ScoredToken> BatchRows::scored_tokens() const {
  const std::vector<Slot> mine = slots(rank_);
  std::vector<ScoredToken> out(mine.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    const auto [b, g] = mine[i];  // row g scores token g + 1
    out[i] = {b, g + 1 < lengths_[b] ? g + 1 : -1};
  }
  return out;
}

#define RT_INSTANTIATE(T)                                                                                  \
  template std::vector<std::vector<float>> BatchRows::to_tokens<T>(const T*, int64_t) const;              \
  template std::vector<T> BatchRows::row_grads<T>(const std::vector<std::vector<float>>&) const;
RT_INSTANTIATE(float)
RT_INSTANTIATE(double)
#undef RT_INSTANTIATE

}  // namespace ringtrain::model
