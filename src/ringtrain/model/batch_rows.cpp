#include "ringtrain/model/batch_rows.h"

#include <algorithm>
#include <limits>

#include "ringtrain/core/device_ops.h"
#include "ringtrain/core/error.h"
#include "ringtrain/cp/zigzag.h"
#include "ringtrain/model/cp_scoring.h"

namespace ringtrain::model {

BatchRows::BatchRows(const TokenBatch& batch, int64_t vocab, int cp, int rank)
    : packed_(batch.packed), cp_(cp), rank_(rank) {
  for (size_t b = 0; b < batch.sequences.size(); ++b) {
    const std::vector<int32_t>& seq = batch.sequences[b];
    RT_CHECK(!seq.empty(), "policy: sequence ", b, " of the batch is empty");
    for (size_t p = 0; p < seq.size(); ++p)
      RT_CHECK(seq[p] >= 0 && seq[p] < vocab, "policy: token id ", seq[p], " at position ", p, " of sequence ", b,
               " is outside the vocabulary [0, ", vocab, ")");
    lengths_.push_back(static_cast<int64_t>(seq.size()));
  }
  lay_out();
  const std::vector<Slot> mine = slots(rank);
  tokens_.assign(mine.size(), 0);
  targets_.assign(mine.size(), -1);
  for (size_t i = 0; i < mine.size(); ++i) {
    const auto [b, g] = mine[i];
    const std::vector<int32_t>& seq = batch.sequences[static_cast<size_t>(b)];
    if (g < lengths_[b]) tokens_[i] = seq[g];
    if (g + 1 < lengths_[b]) targets_[i] = seq[g + 1];
  }
}

BatchRows::BatchRows(std::vector<int64_t> lengths, bool packed, int cp, int rank)
    : packed_(packed), cp_(cp), rank_(rank), lengths_(std::move(lengths)) {
  for (size_t b = 0; b < lengths_.size(); ++b)
    RT_CHECK(lengths_[b] >= 1, "policy: sequence ", b, " of the batch is empty");
  lay_out();
}

void BatchRows::lay_out() {
  RT_CHECK(!lengths_.empty(), "policy: empty batch");
  RT_CHECK(cp_ >= 1 && rank_ >= 0 && rank_ < cp_, "policy: rank ", rank_, " of a cp group of ", cp_);
  int64_t total = 0;
  for (int64_t len : lengths_) max_len_ = std::max(max_len_, len), total += len;
  // Zigzag pads a sequence by less than 2 * cp tokens; a packed row's offsets (cu_seqlens) are int32.
  const int64_t limit = std::numeric_limits<int32_t>::max() / 2;
  RT_CHECK(max_len_ < limit, "policy: a sequence of ", max_len_, " tokens is too long");
  RT_CHECK(!packed_ || total < limit, "policy: a packed batch of ", total, " tokens is too long");
  const std::vector<Slot> mine = slots(rank_);
  const int64_t n = static_cast<int64_t>(mine.size());
  row_len_ = packed_ ? n : n / sequences();
  positions_.resize(mine.size());
  for (size_t i = 0; i < mine.size(); ++i) positions_[i] = static_cast<int32_t>(mine[i].index);
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

BatchRows::SourceOffsets BatchRows::source_offsets(const std::vector<int64_t>& rows, int64_t row_stride,
                                                   int64_t col_stride) const {
  RT_CHECK(static_cast<int64_t>(rows.size()) == sequences(), "policy: ", rows.size(), " rows for ", sequences(),
           " sequences");
  const std::vector<Slot> mine = slots(rank_);
  SourceOffsets out;
  out.tokens.assign(mine.size(), -1);
  out.targets.assign(mine.size(), -1);
  for (size_t i = 0; i < mine.size(); ++i) {
    const auto [b, g] = mine[i];
    const int64_t row = rows[static_cast<size_t>(b)] * row_stride;
    if (g < lengths_[b]) out.tokens[i] = row + g * col_stride;
    if (g + 1 < lengths_[b]) out.targets[i] = row + (g + 1) * col_stride;
  }
  return out;
}

std::vector<int64_t> BatchRows::result_offsets(const std::vector<int64_t>& rows, int64_t cols) const {
  RT_CHECK(static_cast<int64_t>(rows.size()) == sequences(), "policy: ", rows.size(), " rows for ", sequences(),
           " sequences");
  const int64_t n = local_tokens();
  std::vector<int64_t> out(static_cast<size_t>(cp_ * n), -1);
  for (int r = 0; r < cp_; ++r) {
    const std::vector<Slot> held = slots(r);
    RT_CHECK(static_cast<int64_t>(held.size()) == n, "policy: rank ", r, " holds ", held.size(), " rows, rank ",
             rank_, " ", n);
    for (size_t i = 0; i < held.size(); ++i) {
      const auto [b, g] = held[i];  // row g scores token g + 1
      if (g + 1 < lengths_[b]) out[static_cast<size_t>(r * n) + i] = rows[static_cast<size_t>(b)] * cols + g + 1;
    }
  }
  return out;
}

void check_score_rows(const TokenRows& batch, const TensorView& logprobs, const TensorView& entropy, int64_t vocab) {
  const TensorView& ids = batch.ids;
  RT_CHECK(ids.ndim == 2 && (ids.dtype == DType::I32 || ids.dtype == DType::I64),
           "policy: token rows must be a 2-D int32 or int64 view, not ", ids.shape_str());
  RT_CHECK(!batch.rows.empty(), "policy: empty batch");
  RT_CHECK(batch.rows.size() == batch.lengths.size(), "policy: ", batch.rows.size(), " rows with ",
           batch.lengths.size(), " lengths");
  const int64_t R = ids.shape[0], C = ids.shape[1];
  std::vector<int64_t> checked(static_cast<size_t>(R), 0);  // per row of ids: the columns to check
  for (size_t i = 0; i < batch.rows.size(); ++i) {
    const int64_t r = batch.rows[i], len = batch.lengths[i];
    RT_CHECK(r >= 0 && r < R, "policy: sequence ", i, " is row ", r, " of ", R);
    RT_CHECK(len >= 1 && len <= C, "policy: sequence ", i, " (row ", r, ") has length ", len, "; rows hold 1 to ", C,
             " tokens");
    checked[static_cast<size_t>(r)] = std::max(checked[static_cast<size_t>(r)], len);
  }
  for (const TensorView* v : {&logprobs, &entropy}) {
    if (v == &entropy && !entropy.data) continue;
    RT_CHECK(v->dtype == DType::F32 && v->ndim == 2 && v->shape[0] == R && v->shape[1] == C && v->is_contiguous(),
             "policy: scores go into contiguous float32 [", R, ", ", C, "] views, not ", v->shape_str());
  }
  const int64_t bad = device_ops(ids, "token rows").first_outside(ids, checked, vocab);
  if (bad < 0) return;
  throw Error(cat("policy: token id ", integer_at(ids, bad), " at position ", bad % C, " of row ", bad / C,
                  " is outside the vocabulary [0, ", vocab, ")"));
}

#define RT_INSTANTIATE(T)                                                                                  \
  template std::vector<std::vector<float>> BatchRows::to_tokens<T>(const T*, int64_t) const;              \
  template std::vector<T> BatchRows::row_grads<T>(const std::vector<std::vector<float>>&) const;
RT_INSTANTIATE(float)
RT_INSTANTIATE(double)
#undef RT_INSTANTIATE

}  // namespace ringtrain::model
