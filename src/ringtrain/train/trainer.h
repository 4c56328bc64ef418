// The train step over a dp × cp mesh with ZeRO-2 sharding (docs/DESIGN.md "Training").
//
// step(global batch), on every rank with the same batch:
//   1. the batch is cut into dp contiguous parts (whole DPO pairs), this rank's part into microbatches;
//   2. the valid token / sequence (and DPO pair) counts of the whole batch are all-reduced over dp;
//   3. zero grads; per microbatch: policy.score → loss normalised by the global counts → policy.backward;
//   4. the flat gradient is reduce-scattered (sum) over all dp · cp ranks, in place, into this rank's shard;
//   5. the shard's Σg² is all-reduced → global norm; NaN/Inf, or no valid token in the whole batch, skips the
//      step on every rank; clip coefficient;
//   6. AdamW on the shard's master weights and moments (fp32; fp64 for an F64 policy), writing the shard's new
//      compute weights into the policy's weights(); an in-place all-gather gives every rank all of them;
//   7. the LR schedule steps (also after a skipped step).
// Nothing here branches on the device: buffers are the policy's views, the optimizer's kernels come from
// device_optimizer.h on a GPU.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "ringtrain/core/stop_request.h"
#include "ringtrain/core/tensor.h"
#include "ringtrain/model/policy.h"
#include "ringtrain/train/losses.h"
#include "ringtrain/train/mesh.h"
#include "ringtrain/train/optimizer.h"
#include "ringtrain/train/schedule.h"

namespace ringtrain::train {

// A global batch: per sequence its tokens and, in token order with the sequence's length, what the loss reads.
// Position 0 of a sequence never counts. Fields a loss does not read may stay empty: NLL reads the masks; the
// clipped PG prev_logprobs and advantages (+ ref_logprobs with kl_beta, gen_logprobs when given); DPO ref_logprobs
// with sequences 2i (chosen) and 2i+1 (rejected) forming pair i.
struct TrainBatch {
  std::vector<std::vector<int32_t>> sequences;
  std::vector<std::vector<uint8_t>> token_mask;  // empty: every token of every sequence
  std::vector<uint8_t> sample_mask;              // empty: every sequence
  std::vector<std::vector<float>> advantages, prev_logprobs, ref_logprobs, gen_logprobs;
};

// A global batch read where it lies, on the policy's GPU (a caller's CUDA tensors): sequence i is row i of the
// integer [B, C] view `ids` (I32 or I64, any strides), its first lengths[i] entries (1 <= lengths[i] <= C). The
// other fields have TrainBatch's meaning and are views on the same device, any strides, empty when absent:
// token_mask and the logprobs [B, C]; sample_mask [B]; advantages [B, C] or [B] (one per sequence). Masks hold 0 or
// 1 in any dtype, the rest is floating.
struct TrainRows {
  TensorView ids;
  std::vector<int64_t> lengths;
  TensorView token_mask, sample_mask, advantages, prev_logprobs, ref_logprobs, gen_logprobs;
};

// The microbatches of a dp rank's part of the batch, from its sequences' lengths: per microbatch, indices into the
// part (each exactly once; DPO pairs (2k, 2k + 1) kept together, chosen first).
using MicrobatchPlanner = std::function<std::vector<std::vector<int64_t>>(const std::vector<int64_t>& lengths)>;

struct TrainerConfig {
  int64_t micro_batch_size = 1;  // sequences per microbatch (even for DPO) when there is no planner
  MicrobatchPlanner plan;        // e.g. token-budget bins (worker/packing.h); empty: runs of micro_batch_size
  bool packed = false;           // each microbatch as one packed row (TokenBatch::packed), not padded to its longest
  LossConfig loss;
  AdamWConfig adamw;
  ScheduleConfig schedule;
};

// A metric's value where nothing was counted (a step with no valid token or pair): none, which metrics.jsonl writes
// as null, rather than a 0 that reads as a measured ratio or KL.
inline constexpr double kNoValue = std::numeric_limits<double>::quiet_NaN();

struct Metric {
  std::string name;
  double value = 0;  // global sum / global count; kNoValue when the count is 0
  double count = 0;
};

struct StepResult {
  int64_t step = 0;  // 1 for the first step
  double loss = 0;   // the global loss (the same on every rank)
  double grad_norm = 0;
  double lr = 0;
  double valid_tokens = 0, valid_sequences = 0;
  std::vector<Metric> metrics;             // the loss's metrics over the whole batch
  std::vector<double> microbatch_losses;   // this rank's microbatches' contributions to the loss
  bool skipped = false;  // non-finite gradient norm or no valid token: nothing was updated on any rank
};

// The phases of a step, for timing (bench_train.h).
// ForwardBackward replaces Forward and Backward for a token-local loss, whose gradient the policy applies inside the
// forward's LM head (model::Policy::score_and_backward); Loss then only evaluates the value and the metrics.
enum class Phase { Forward, ForwardBackward, Loss, Backward, ReduceScatter, NormClip, AdamW, AllGather };
const char* phase_name(Phase p);
// Called when a phase ends (after the rank's work of that phase was enqueued).
using PhaseHook = std::function<void(Phase)>;

// The optimizer state of this rank: elements [begin, end) of the policy's flat buffers.
struct ShardState {
  int64_t begin = 0, end = 0;
  Tensor master, exp_avg, exp_avg_sq;  // on the policy's device; F32 (F64 for an F64 policy)
};

class Trainer {
 public:
  // The policy is this rank's (under CP made over mesh.cp_group()); its current weights, the same on every rank,
  // are the starting point. Neither is owned; both must outlive the trainer. stop (given on every rank or on none,
  // not owned): a step checks it before each microbatch and stops there, every rank together, with
  // comm::Interrupted (comm/agreed.h): no weight, counter or optimizer state changed.
  Trainer(const TrainerConfig& cfg, model::Policy& policy, const Mesh& mesh, const StopRequest* stop = nullptr);

  StepResult step(const TrainBatch& batch, const PhaseHook& on_phase_end = {});
  // The same step from rows on the policy's device (trainer_rows.cpp): the inputs are gathered into microbatches,
  // scored, differentiated and reduced there (device_loss.h, model::DeviceRowsTraining), and only the counts, the
  // loss's sums and the checks' verdicts (a few bytes per microbatch) come back to the host. Needs a policy with
  // device_rows_training() and a build with device loss kernels; the results are step(TrainBatch)'s up to the order
  // of fp64 sums.
  StepResult step(const TrainRows& batch, const PhaseHook& on_phase_end = {});

  const TrainerConfig& config() const { return cfg_; }
  model::Policy& policy() const { return *policy_; }
  const Mesh& mesh() const { return *mesh_; }
  int64_t steps_taken() const { return steps_; }              // train steps, skipped ones included
  int64_t optimizer_steps() const { return completed_; }      // updates applied
  int64_t schedule_position() const { return schedule_.position(); }
  // The shard of rank `rank` of the world for a flat buffer of n elements: equal parts of n / world, the last rank
  // also holding the remainder.
  static std::pair<int64_t, int64_t> shard_range(int64_t n, int world, int rank);

  // For checkpoints (checkpoint.h): the shard, and restoring counters after its tensors were filled; refresh_weights
  // writes the compute weights from the master shards of all ranks (collective over the world).
  ShardState& shard() { return shard_; }
  void restore_counters(int64_t steps, int64_t optimizer_steps, int64_t schedule_position);
  void refresh_weights();

 private:
  // Steps 4-7 of a step whose gradients are in the policy's buffer.
  void apply_gradients(StepResult& out, const PhaseHook& on_phase_end);
  void all_gather_weights();
  // Before a step's last backward: where no reduction of the gradients follows (a world of one rank) and the policy
  // can, the norm's sum of squares is computed beside that backward into norm_result_ instead of in a pass after it.
  void ask_norm_beside_last_backward();

  TrainerConfig cfg_;
  model::Policy* policy_;
  const Mesh* mesh_;
  const StopRequest* stop_;
  LRSchedule schedule_;
  ShardState shard_;
  int64_t steps_ = 0, completed_ = 0;
  Tensor norm_result_;  // one fp64 value on the device for the kernels' sum of squares
  bool norm_beside_backward_ = false;  // norm_result_ is being filled by the step's last backward
};

}  // namespace ringtrain::train
