// AdamW state of one shard on the host, for tests: plan_adamw_step and adamw_update (train/optimizer.h) over moments
// it owns, as the trainer runs them over its ShardState.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ringtrain/core/error.h"
#include "ringtrain/train/optimizer.h"

namespace ringtrain::train {

// fp32 (M = float) or fp64 (M = double) moments and step count.
template <typename M>
class AdamW {
 public:
  AdamW(const AdamWConfig& cfg, int64_t shard_begin, int64_t shard_end);

  // master and grad: the shard's [shard_end - shard_begin] elements; master is updated in place, out (if set)
  // receives the new weights of the shard in the compute dtype. Returns what was done (see AdamWStep).
  AdamWStep step(std::span<M> master, std::span<const M> grad, double lr, double global_grad_sq_norm,
                 ComputeWeights out = {});

  int64_t shard_begin() const { return begin_; }
  int64_t shard_end() const { return end_; }
  int64_t completed_steps() const { return completed_steps_; }
  const AdamWConfig& config() const { return cfg_; }

  // Checkpoint state: the step count and the two moment shards as flat buffers of shard size.
  std::span<const M> exp_avg() const { return exp_avg_; }
  std::span<const M> exp_avg_sq() const { return exp_avg_sq_; }
  void load_state(int64_t completed_steps, std::span<const M> exp_avg, std::span<const M> exp_avg_sq);

 private:
  AdamWConfig cfg_;
  int64_t begin_, end_;
  int64_t completed_steps_ = 0;
  std::vector<M> exp_avg_, exp_avg_sq_;
};

template <typename M>
inline AdamW<M>::AdamW(const AdamWConfig& cfg, int64_t shard_begin, int64_t shard_end)
    : cfg_(cfg), begin_(shard_begin), end_(shard_end) {
  validate(cfg);
  RT_CHECK(shard_begin >= 0 && shard_end >= shard_begin, "AdamW: bad shard [", shard_begin, ", ", shard_end, ")");
  exp_avg_.assign(static_cast<size_t>(end_ - begin_), M(0));
  exp_avg_sq_.assign(static_cast<size_t>(end_ - begin_), M(0));
}

template <typename M>
inline AdamWStep AdamW<M>::step(std::span<M> master, std::span<const M> grad, double lr, double global_grad_sq_norm,
                         ComputeWeights out) {
  const size_t n = exp_avg_.size();
  RT_CHECK(master.size() == n && grad.size() == n, "AdamW: shard [", begin_, ", ", end_, ") has ", n,
           " elements but got ", master.size(), " master weights and ", grad.size(), " gradients");
  const AdamWStep s = plan_adamw_step(cfg_, completed_steps_, lr, global_grad_sq_norm);
  adamw_update(s, master.data(), exp_avg_.data(), exp_avg_sq_.data(), grad.data(), static_cast<int64_t>(n), out);
  if (!s.skipped) completed_steps_ = s.step;
  return s;
}

template <typename M>
inline void AdamW<M>::load_state(int64_t completed_steps, std::span<const M> exp_avg, std::span<const M> exp_avg_sq) {
  RT_CHECK(completed_steps >= 0, "AdamW state: step count ", completed_steps, " < 0");
  RT_CHECK(exp_avg.size() == exp_avg_.size() && exp_avg_sq.size() == exp_avg_sq_.size(), "AdamW state: shard [",
           begin_, ", ", end_, ") has ", exp_avg_.size(), " elements but the state has ", exp_avg.size(), " and ",
           exp_avg_sq.size());
  completed_steps_ = completed_steps;
  exp_avg_.assign(exp_avg.begin(), exp_avg.end());
  exp_avg_sq_.assign(exp_avg_sq.begin(), exp_avg_sq.end());
}

}  // namespace ringtrain::train
