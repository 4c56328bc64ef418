// Microbatches of a dp rank's sequences.
//
// With sequence packing, first-fit-decreasing puts the sequences into bins of at most `budget` tokens
// (policy.sequence_packing.train_mb_tokens / logprob_mb_tokens); each bin becomes one packed row with cu_seqlens and
// positions restarting at every document. Without packing, microbatches either hold a fixed number of sequences
// (policy.train_micro_batch_size) or are cut from the sequences sorted by length so that each padded microbatch
// (count x longest) stays within a token budget.
//
// Both are deterministic: equal lengths are ordered by index. A unit longer than the budget is an error naming it
// (Config::validate keeps the budgets at least policy.max_total_sequence_length, so valid data always fits).
// `group` consecutive sequences form one unit that is never split (2 for DPO: chosen and rejected).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "ringtrain/core/error.h"
#include "ringtrain/worker/config.h"

namespace ringtrain::worker {

struct Microbatch {
  std::vector<int64_t> sequences;  // indices into the caller's list, in the order the microbatch holds them
  int64_t tokens = 0;              // sum of their lengths
};

// First-fit-decreasing of units into bins of `budget` tokens: units by decreasing length (ties: lower index first),
// each into the first bin (lowest index) with room, else a new bin. O(n log n).
std::vector<Microbatch> first_fit_decreasing(const std::vector<int64_t>& lengths, int64_t budget, int group = 1);

// Sorted-length bucketing for unpacked (padded) microbatches: units by increasing length (ties by index), cut into
// consecutive groups whose padded size, sequences x longest, is at most `budget`.
std::vector<Microbatch> bucket_by_length(const std::vector<int64_t>& lengths, int64_t budget, int group = 1);

// Fixed-size microbatches of `units_per_microbatch` units in input order (the last may be smaller).
std::vector<Microbatch> fixed_microbatches(const std::vector<int64_t>& lengths, int64_t units_per_microbatch,
                                           int group = 1);

// The microbatches of one dp rank's sequences as the config asks: first-fit-decreasing bins with sequence_packing,
// length buckets with dynamic_batching, else train_micro_batch_size units (training; DPO pairs as units) or
// logprob_batch_size sequences (scoring). Budgets from Config::train_mb_tokens / logprob_mb_tokens.
enum class Pass { Train, Score };
std::vector<Microbatch> plan_microbatches(const Config& c, const std::vector<int64_t>& lengths, Pass pass);

// One packed row: the microbatch's sequences back to back.
struct PackedRow {
  std::vector<int32_t> input_ids;
  std::vector<int32_t> positions;   // 0, 1, ... restarting at each sequence
  std::vector<int32_t> cu_seqlens;  // sequence starts with a leading 0 and the total at the end
};
PackedRow pack_row(const std::vector<std::vector<int32_t>>& sequences, const Microbatch& mb);

// The inverse of splitting into microbatches: per_microbatch[m][k] is the result for sequence mbs[m].sequences[k];
// returns the results indexed like the original sequences. Every index must occur exactly once.
template <typename T>
std::vector<T> restore_order(const std::vector<Microbatch>& mbs, std::vector<std::vector<T>> per_microbatch,
                             size_t n_sequences);

// Splits a packed row's per-token values (e.g. logprobs of the packed row) into per-sequence vectors by cu_seqlens.
std::vector<std::vector<float>> unpack_row(const PackedRow& row, const std::vector<float>& values);

template <typename T>
std::vector<T> restore_order(const std::vector<Microbatch>& mbs, std::vector<std::vector<T>> per_microbatch,
                             size_t n_sequences) {
  RT_CHECK(per_microbatch.size() == mbs.size(), "restore_order: ", per_microbatch.size(), " results for ", mbs.size(),
           " microbatches");
  std::vector<T> out(n_sequences);
  std::vector<bool> seen(n_sequences, false);
  for (size_t m = 0; m < mbs.size(); ++m) {
    const std::vector<int64_t>& idx = mbs[m].sequences;
    RT_CHECK(per_microbatch[m].size() == idx.size(), "restore_order: microbatch ", m, " has ", per_microbatch[m].size(),
             " results for ", idx.size(), " sequences");
    for (size_t k = 0; k < idx.size(); ++k) {
      const int64_t i = idx[k];
      RT_CHECK(i >= 0 && static_cast<size_t>(i) < n_sequences && !seen[i], "restore_order: sequence ", i,
               " is out of range or in two microbatches");
      seen[i] = true;
      out[i] = std::move(per_microbatch[m][k]);
    }
  }
  for (size_t i = 0; i < n_sequences; ++i) RT_CHECK(seen[i], "restore_order: sequence ", i, " is in no microbatch");
  return out;
}

}  // namespace ringtrain::worker
