// AdamW on a contiguous shard [begin, end) of the flat parameter vector (the trainer shards over ranks, ZeRO
// style), with global-norm gradient clipping and a skipped step on a non-finite norm.
//
// The flow of one step: every rank computes sum_of_squares of its gradient shard, the trainer all-reduces the sums,
// plan_adamw_step turns the global sum into an AdamWStep (skip or not, clip coefficient, bias corrections), and the
// update runs on the shard (adamw_update on the host, the kernels of train/device_optimizer.h on a GPU) with the same
// per-element arithmetic in the master type. The trainer keeps the moments (train/trainer.h's ShardState).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ringtrain/core/dtype.h"

namespace ringtrain::train {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;  // decoupled: p -= lr·wd·p
  double max_grad_norm = 1.0;  // <= 0: no clipping
};
void validate(const AdamWConfig& cfg);

// One step's scalars, decided on the host once for every shard.
struct AdamWStep {
  bool skipped = false;  // the global norm is NaN or Inf: weights, moments and the step count stay as they are
  double grad_norm = 0;  // global L2 norm of the gradients before clipping
  double clip_coef = 1;  // multiplies the gradients: max_norm / (norm + 1e-6) when that is < 1, else 1
  int64_t step = 0;      // t of this update (1 for the first)
  double lr = 0;
  // Per-element factors (PyTorch's AdamW): p·decay_factor - step_size·m̂/(sqrt(v)/bias_correction2_sqrt + eps).
  double beta1 = 0, beta2 = 0, eps = 0;
  double decay_factor = 1;            // 1 - lr·wd
  double step_size = 0;               // lr / (1 - beta1^t)
  double bias_correction2_sqrt = 1;   // sqrt(1 - beta2^t)
};
// completed_steps: updates applied so far (not counting skipped ones).
AdamWStep plan_adamw_step(const AdamWConfig& cfg, int64_t completed_steps, double lr, double global_grad_sq_norm);

// An AdamWStep's per-element factors rounded once to the master type: what adamw_update and the CUDA kernel use.
template <typename M>
struct AdamWScalars {
  M clip, beta1, beta2, one_minus_beta1, one_minus_beta2, decay, step_size, bias_correction2_sqrt, eps;
};
template <typename M>
AdamWScalars<M> adamw_scalars(const AdamWStep& s);

// Σ g² of a gradient shard, accumulated in fp64 in index order.
template <typename M>
double sum_of_squares(std::span<const M> grad);

// Where the updated weights are also written in the compute dtype (F32, F64 or BF16); data == nullptr: nowhere.
struct ComputeWeights {
  void* data = nullptr;
  DType dtype = DType::BF16;
};

// The element-wise update of n elements, in the master type M's arithmetic (no fused multiply-adds, so that the
// CUDA kernel can reproduce it bit for bit). Does nothing for a skipped step.
template <typename M>
void adamw_update(const AdamWStep& s, M* master, M* exp_avg, M* exp_avg_sq, const M* grad, int64_t n,
                  ComputeWeights out);

}  // namespace ringtrain::train
