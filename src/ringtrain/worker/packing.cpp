#include "ringtrain/worker/packing.h"

#include <algorithm>
#include <limits>
#include <numeric>

namespace ringtrain::worker {
namespace {

// The units' token counts: `group` consecutive sequences each; errors name the unit and its sequences.
std::vector<int64_t> unit_lengths(const std::vector<int64_t>& lengths, int64_t budget, int group) {
  RT_CHECK(group >= 1, "group ", group, ": must be at least 1");
  RT_CHECK(budget >= 1, "token budget ", budget, ": must be at least 1");
  RT_CHECK(lengths.size() % static_cast<size_t>(group) == 0, lengths.size(), " sequences do not form groups of ",
           group);
  std::vector<int64_t> units(lengths.size() / group, 0);
  for (size_t i = 0; i < lengths.size(); ++i) {
    RT_CHECK(lengths[i] >= 1 && lengths[i] <= std::numeric_limits<int32_t>::max(), "sequence ", i, " has ", lengths[i],
             " tokens (expected 1 to 2^31 - 1)");
    units[i / group] += lengths[i];
  }
  for (size_t u = 0; u < units.size(); ++u) {
    RT_CHECK(units[u] <= budget,
             group == 1 ? cat("sequence ", u) : cat("sequences ", u * group, "-", (u + 1) * group - 1), " has ",
             units[u], " tokens, above the microbatch budget of ", budget);
  }
  return units;
}

void add_unit(Microbatch& mb, int64_t unit, int group, int64_t tokens) {
  for (int k = 0; k < group; ++k) mb.sequences.push_back(unit * group + k);
  mb.tokens += tokens;
}

// The first bin (lowest index) whose free room is at least `need`: a max segment tree over the bins' room, so each
// placement is O(log n) instead of a scan over all bins.
class FirstFit {
 public:
  explicit FirstFit(size_t max_bins) {
    while (leaves_ < max_bins) leaves_ *= 2;
    room_.assign(2 * leaves_, -1);  // -1: no bin opened there yet
  }
  // Returns the bin's index, opening a new one with `budget` room when none fits.
  size_t place(int64_t need, int64_t budget) {
    size_t node = 1;
    if (room_[1] < need) {
      node = leaves_ + opened_++;
      set(node, budget);
    } else {
      while (node < leaves_) node = room_[2 * node] >= need ? 2 * node : 2 * node + 1;
    }
    set(node, room_[node] - need);
    return node - leaves_;
  }

 private:
  void set(size_t leaf, int64_t room) {
    room_[leaf] = room;
    for (size_t n = leaf / 2; n >= 1; n /= 2) room_[n] = std::max(room_[2 * n], room_[2 * n + 1]);
  }
  size_t leaves_ = 1, opened_ = 0;
  std::vector<int64_t> room_;
};

}  // namespace

std::vector<Microbatch> first_fit_decreasing(const std::vector<int64_t>& lengths, int64_t budget, int group) {
  const std::vector<int64_t> units = unit_lengths(lengths, budget, group);
  std::vector<int64_t> order(units.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return units[a] > units[b]; });
  std::vector<Microbatch> bins;
  FirstFit fit(std::max<size_t>(units.size(), 1));
  for (int64_t u : order) {
    const size_t bin = fit.place(units[u], budget);
    if (bin == bins.size()) bins.emplace_back();
    add_unit(bins[bin], u, group, units[u]);
  }
  return bins;
}

std::vector<Microbatch> bucket_by_length(const std::vector<int64_t>& lengths, int64_t budget, int group) {
  const std::vector<int64_t> units = unit_lengths(lengths, budget, group);
  std::vector<int64_t> order(units.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return units[a] < units[b]; });
  // The padded size counts every sequence at the longest sequence's length; a unit's longest member decides.
  auto longest = [&](int64_t u) {
    int64_t m = 0;
    for (int k = 0; k < group; ++k) m = std::max(m, lengths[u * group + k]);
    return m;
  };
  std::vector<Microbatch> out;
  int64_t longest_in_mb = 0;
  for (int64_t u : order) {
    const int64_t l = std::max(longest_in_mb, longest(u));
    const int64_t count = out.empty() ? 0 : static_cast<int64_t>(out.back().sequences.size());
    if (out.empty() || (count + group) * l > budget) {
      RT_CHECK(group * longest(u) <= budget, "sequences ", u * group, "-", (u + 1) * group - 1, " need ",
               group * longest(u), " padded tokens, above the microbatch budget of ", budget);
      out.emplace_back();
      longest_in_mb = longest(u);
    } else {
      longest_in_mb = l;
    }
    add_unit(out.back(), u, group, units[u]);
  }
  return out;
}

std::vector<Microbatch> fixed_microbatches(const std::vector<int64_t>& lengths, int64_t units_per_microbatch,
                                           int group) {
  RT_CHECK(units_per_microbatch >= 1, "microbatch size ", units_per_microbatch, ": must be at least 1");
  const std::vector<int64_t> units = unit_lengths(lengths, std::numeric_limits<int64_t>::max(), group);
  std::vector<Microbatch> out;
  for (size_t u = 0; u < units.size(); ++u) {
    if (u % static_cast<size_t>(units_per_microbatch) == 0) out.emplace_back();
    add_unit(out.back(), static_cast<int64_t>(u), group, units[u]);
  }
  return out;
}

std::vector<Microbatch> plan_microbatches(const Config& c, const std::vector<int64_t>& lengths, Pass pass) {
  const bool train = pass == Pass::Train;
  const int group = train && c.loss_fn.type == LossType::Dpo ? 2 : 1;
  const int64_t budget = train ? c.train_mb_tokens() : c.logprob_mb_tokens();
  if (c.policy.sequence_packing.enabled) return first_fit_decreasing(lengths, budget, group);
  if (c.policy.dynamic_batching.enabled) return bucket_by_length(lengths, budget, group);
  return fixed_microbatches(lengths, train ? c.policy.train_micro_batch_size : c.policy.logprob_batch_size, group);
}

PackedRow pack_row(const std::vector<std::vector<int32_t>>& sequences, const Microbatch& mb) {
  PackedRow row;
  row.cu_seqlens.push_back(0);
  for (int64_t i : mb.sequences) {
    RT_CHECK(i >= 0 && static_cast<size_t>(i) < sequences.size(), "pack_row: sequence ", i, " of ", sequences.size());
    const std::vector<int32_t>& s = sequences[i];
    RT_CHECK(row.input_ids.size() + s.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
             "pack_row: more than 2^31 - 1 tokens in one row");
    row.input_ids.insert(row.input_ids.end(), s.begin(), s.end());
    for (size_t p = 0; p < s.size(); ++p) row.positions.push_back(static_cast<int32_t>(p));
    row.cu_seqlens.push_back(static_cast<int32_t>(row.input_ids.size()));
  }
  return row;
}

std::vector<std::vector<float>> unpack_row(const PackedRow& row, const std::vector<float>& values) {
  RT_CHECK(values.size() == row.input_ids.size(), "unpack_row: ", values.size(), " values for a row of ",
           row.input_ids.size(), " tokens");
  std::vector<std::vector<float>> out;
  for (size_t d = 0; d + 1 < row.cu_seqlens.size(); ++d)
    out.emplace_back(values.begin() + row.cu_seqlens[d], values.begin() + row.cu_seqlens[d + 1]);
  return out;
}

}  // namespace ringtrain::worker
