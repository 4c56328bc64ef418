// A microbatch as a Policy runs it (shared by the CPU and GPU policies): this rank's rows of one forward, in one of
// two layouts (TokenBatch::packed), and the attention that keeps every sequence to itself.
//  - Padded: every sequence padded at its end to the longest one, S_max, and run as [B, row_len], row_len = S_max
//    on one rank or, under CP, this rank's zigzag shard of the padded row (cp/zigzag.h, the same for every row).
//  - Packed: the sequences back to back in one row ([1, row_len]), positions restarting at 0 in each; on one rank
//    row_len is their total, under CP each sequence is zigzag-sharded on its own (cp::PackedZigzag) and the row holds
//    this rank's shard of every sequence. Attention is packed (THD with cu_seqlens, causal per sequence).
// Padding (zigzag padding too) carries token 0 and target -1, and each sequence's last token has target -1: under
// the causal mask a trailing pad never reaches an earlier token, and with no target it has no gradient, so the real
// tokens score exactly as alone, and every pad's activation gradient is exactly zero.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ringtrain/comm/communicator.h"
#include "ringtrain/cp/cp_attention.h"
#include "ringtrain/model/policy.h"
#include "ringtrain/model/sequence_attention.h"

namespace ringtrain::model {

// What Policy::score_into checks before it scores, on every policy: rows and lengths (each in [1, C]), the result
// views (float32, ids' shape, contiguous; entropy only when it has data) and the token ids of every listed row (on
// their device), in that order; errors name the row and the position.
void check_score_rows(const TokenRows& batch, const TensorView& logprobs, const TensorView& entropy, int64_t vocab);

class BatchRows {
 public:
  // Checks the batch (not empty, no empty sequence, token ids in [0, vocab)) and lays out rank `rank` of `cp`.
  BatchRows(const TokenBatch& batch, int64_t vocab, int cp, int rank);
  // The layout of sequences of these lengths (each at least 1) alone, for tokens that stay where they are
  // (source_offsets): tokens() and targets() stay empty.
  BatchRows(std::vector<int64_t> lengths, bool packed, int cp, int rank);

  int64_t sequences() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t batch() const { return packed_ ? 1 : sequences(); }  // rows of the forward
  int64_t row_len() const { return row_len_; }                  // this rank's tokens per row
  int64_t local_tokens() const { return batch() * row_len_; }
  // This rank's [batch * row_len] tokens at their positions in their sequence, the next token as target.
  const std::vector<int32_t>& tokens() const { return tokens_; }
  const std::vector<int32_t>& positions() const { return positions_; }
  const std::vector<int32_t>& targets() const { return targets_; }

  // The model's attention for these rows: over `cp_group` (null: one rank) with `config`.
  std::unique_ptr<SequenceAttention> attention(comm::Communicator* cp_group, const cp::CpConfig& config) const;

  // Per sequence in token order (position 0 = 0) from every rank's row results: rank r's local_tokens() values
  // start at gathered + r * block_stride (one rank: gathered is this rank's rows).
  template <typename T>
  std::vector<std::vector<float>> to_tokens(const T* gathered, int64_t block_stride) const;
  // d(loss)/d(row result) for this rank's rows from d(loss)/d(logprob) per sequence in token order (shape checked).
  template <typename T>
  std::vector<T> row_grads(const std::vector<std::vector<float>>& d_logprobs) const;
  // The token each of this rank's rows scores: sequence seq, position pos (pos = -1 where the row scores nothing:
  // padding, or a sequence's last token).
  struct ScoredToken {
    int64_t seq, pos;
  };
  std::vector<ScoredToken> scored_tokens() const;

  // For TokenRows: element offsets into the [R, C] ids view (strides row_stride, col_stride) whose row rows[b] holds
  // sequence b. This rank's row i reads its token at tokens[i] and its target at targets[i]; -1 stands for token 0
  // (padding) and target -1.
  struct SourceOffsets {
    std::vector<int64_t> tokens, targets;
  };
  SourceOffsets source_offsets(const std::vector<int64_t>& rows, int64_t row_stride, int64_t col_stride) const;
  // Where every rank's row results go in a contiguous [R, cols] result whose row rows[b] is sequence b: entry
  // r * local_tokens() + i (rank r's row i) goes to offset rows[b] * cols + p, or nowhere (-1: padding, a last token).
  // Every rank must hold local_tokens() rows, as the gather of the scores assumes.
  std::vector<int64_t> result_offsets(const std::vector<int64_t>& rows, int64_t cols) const;

 private:
  // What local row i of a rank holds: token `index` of sequence `seq` (index >= its length: padding).
  struct Slot {
    int64_t seq, index;
  };
  std::vector<Slot> slots(int rank) const;
  // The checks on the lengths and the positions of this rank's rows.
  void lay_out();

  bool packed_;
  int cp_ = 1, rank_ = 0;
  int64_t max_len_ = 0, row_len_ = 0;
  std::vector<int64_t> lengths_;
  std::vector<int32_t> tokens_, positions_, targets_;
};

}  // namespace ringtrain::model
