// A microbatch as a Policy runs it (shared by the CPU and GPU policies): every sequence padded at its end to the
// longest one, S_max, and run as one [B, rows] forward, rows = S_max on one rank or, under CP, this rank's zigzag
// shard of the padded row (cp/zigzag.h, the same layout for every row). Padding carries token 0 and target -1:
// under the causal mask a trailing pad never reaches an earlier token, and with no target it has no gradient, so
// the real tokens score exactly as alone, and every pad's activation gradient is exactly zero.
#pragma once

#include <cstdint>
#include <vector>

#include "ringtrain/model/policy.h"

namespace ringtrain::model {

class PaddedBatch {
 public:
  // Checks the batch (not empty, no empty sequence, token ids in [0, vocab)) and lays out rank `rank` of `cp`.
  PaddedBatch(const TokenBatch& batch, int64_t vocab, int cp, int rank);

  int64_t sequences() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t max_len() const { return max_len_; }
  int64_t rows() const { return rows_; }  // this rank's rows per sequence
  // This rank's [sequences * rows] rows: tokens at their global positions, the next token as target.
  const std::vector<int32_t>& tokens() const { return tokens_; }
  const std::vector<int32_t>& positions() const { return positions_; }
  const std::vector<int32_t>& targets() const { return targets_; }

  // Per sequence in token order (position 0 = 0) from every rank's row results: rank r's [sequences * rows] values
  // start at gathered + r * block_stride (one rank: gathered is this rank's rows).
  template <typename T>
  std::vector<std::vector<float>> to_tokens(const T* gathered, int64_t block_stride) const;
  // d(loss)/d(row result) for this rank's rows from d(loss)/d(logprob) per sequence in token order (shape checked).
  template <typename T>
  std::vector<T> row_grads(const std::vector<std::vector<float>>& d_logprobs) const;

 private:
  int64_t global_index(int rank, int64_t row) const;
  int cp_ = 1, rank_ = 0;
  int64_t max_len_ = 0, rows_ = 0;
  std::vector<int64_t> lengths_;
  std::vector<int32_t> tokens_, positions_, targets_;
};

}  // namespace ringtrain::model
