// The GRPO loop of `ringtrain grpo` (docs/DESIGN.md, "GRPO loop"). Per step, on every rank of
// the dp × cp mesh with the same inputs:
//   1. num_prompts_per_step prompts (the built-in task or a prompt file, by index from the run's position), each
//      sampled num_generations_per_prompt times by the CPU sampler (model/generate.h) from the current weights;
//   2. rewards against the reference answers (rl/task.h), group-normalised advantages (r − mean) / (std + ε), the
//      same on every response token (group_advantages: the mean and std over the others with
//      grpo.use_leave_one_out_baseline, no division with grpo.normalize_rewards off); a group whose rewards are all
//      equal gets 0 (counted in a metric);
//   3. one Sample per response: prompt + response tokens, the loss mask on the response tokens only, the sampler's
//      logprobs at their token positions; prev logprobs and reference logprobs from the policy worker
//      (worker/policy_worker.h);
//   4. one train step with the configured clipped-PG loss; metrics to metrics.jsonl / TensorBoard and the progress
//      line; a checkpoint every train.checkpoint_every steps.
// An optional SFT warm-up (grpo.sft_warmup_steps) first trains the NLL of the reference answers through a worker of
// the same config with loss nll; its weights become both the GRPO start and the reference policy.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ringtrain/comm/communicator.h"
#include "ringtrain/model/generate.h"
#include "ringtrain/model/policy.h"
#include "ringtrain/rl/task.h"
#include "ringtrain/rl/tokenizer.h"
#include "ringtrain/train/checkpoint.h"
#include "ringtrain/worker/config.h"
#include "ringtrain/worker/data.h"
#include "ringtrain/worker/policy_worker.h"

namespace ringtrain::rl {

// ε of the advantage's denominator: a group with a tiny spread gets large but finite advantages.
constexpr double kAdvantageEps = 1e-6;

struct GroupAdvantages {
  std::vector<double> advantages;  // one per reward, in the rewards' order
  int64_t groups = 0;              // distinct groups
  int64_t uniform_groups = 0;      // groups whose rewards are all equal (advantage 0: no learning signal)
};
// How rewards become advantages (NeMo RL's grpo.normalize_rewards and grpo.use_leave_one_out_baseline).
struct AdvantageOptions {
  bool normalize = true;       // divide by the std (+ eps) where the std is not 0
  bool leave_one_out = false;  // baseline and std over the group's other samples
  double eps = kAdvantageEps;
};
// Rewards in groups: group_of[i] is the group of reward i (any int64 key; a group's members need not be adjacent).
// Sample i's advantage is r_i - baseline, divided by (std + eps) when normalising and the std is not 0; baseline and
// std are the mean and the sample standard deviation (n - 1 in the divisor, as NeMo RL) of its group's rewards, or of
// the others' with leave_one_out (0 for a single other). A group whose rewards are all equal gets 0.
GroupAdvantages group_advantages(std::span<const double> rewards, std::span<const int64_t> group_of,
                                 const AdvantageOptions& options = {});
// The group of each rollout: the index of the first rollout with the same prompt tokens. Rollouts of identical
// prompts form one group, as NeMo RL's calculate_baseline_and_std_per_prompt groups by unique prompt.
std::vector<int64_t> prompt_groups(std::span<const std::vector<int32_t>> prompts);

// The training sample of one rollout: input_ids = prompt + response; token_mask 1 exactly on the response tokens;
// advantages = advantage on the response tokens (0 elsewhere); generation_logprobs[p] = the sampler's logprob of
// token p (0 on the prompt).
worker::Sample rollout_sample(std::span<const int32_t> prompt, const model::Generation& generation, double advantage);
// SFT warm-up: prompt + answer, the loss on the answer tokens only.
worker::Sample sft_sample(std::span<const int32_t> prompt, std::span<const int32_t> answer);

// The built-in task's held-out prompts (grpo.val_prompts empty) are its examples from this index on: above both the
// GRPO steps' and the SFT warm-up's.
inline constexpr uint64_t kValidationIndexBase = uint64_t{1} << 41;

// The prompts of a run: the built-in task (grpo.prompts = builtin:reverse_digits, seeded by train.seed) or a
// prompt file, cycled by index.
class PromptSource {
 public:
  PromptSource(const worker::Config& config, const CharTokenizer& tokenizer);
  Example example(uint64_t index) const;
  // Examples whose lengths bound every example's: a prompt file's records, or the built-in task's longest.
  std::vector<Example> length_bounds() const;
  // What fixes the prompts by index, for checkpoints: the task's name (its examples follow train.seed), or the
  // file's record count and an FNV-1a hash of its records, whatever the path it is named by.
  const std::string& identity() const { return identity_; }
  bool builtin() const { return task_ != nullptr; }

 private:
  std::unique_ptr<ReverseDigitsTask> task_;
  std::vector<Example> file_;
  std::string identity_;
};

// What the loop reports per step, besides metrics.jsonl.
struct GrpoStepLog {
  int64_t step = 0;  // GRPO step, 1-based (warm-up steps are not counted)
  double reward_mean = 0, exact_match = 0;
  double loss = 0, grad_norm = 0;
  bool skipped = false;  // the step changed no weight (worker::kSkippedWhy)
  // The validation after this step (grpo.val_period), if one ran: mean reward and exact-match rate of one greedy
  // response per held-out prompt.
  std::optional<std::pair<double, double>> validation;
};

struct GrpoOptions {
  bool resume = false;
  bool overwrite_metrics = false;  // replace an earlier run's metrics in train.metrics_dir (else a fresh run refuses)
  // Shared by the ranks of this process (one copy of each starting weights); null: each rank loads its own.
  worker::StartingWeights* starting_weights = nullptr;
  bool progress = true;  // the progress line on stderr (rank 0)
  // When requested (on any rank), the run stops at its next safe point (between sampled tokens or microbatches, every
  // rank together) with comm::Interrupted, the step in progress having changed nothing; the lead says where. Not owned.
  const StopRequest* stop = nullptr;
  // Called on every rank after each GRPO step.
  std::function<void(const GrpoStepLog&)> on_step;
};

struct GrpoSummary {
  std::vector<GrpoStepLog> steps;  // this invocation's GRPO steps
  // The validation before the first GRPO step (grpo.val_at_start; not on a resumed run): reward, exact-match rate.
  std::optional<std::pair<double, double>> start_validation;
  int64_t validation_prompts = 0;  // held-out prompts per validation (0: the run does not validate)
  double warmup_seconds = 0, grpo_seconds = 0;
};

// Every check of a GRPO run that reads no weights: the loss (clipped_pg), the prompts (a known built-in task, or a
// prompt file that holds prompts), grpo.reward, grpo.sft_warmup_steps against train.checkpoint_dir, the prompts'
// lengths (a file's every record, the task's longest) against grpo.max_new_tokens and, given the model's config (null: not checked), its vocabulary against the
// task tokenizer's. run_grpo starts with it; `ringtrain config` runs it on a config with grpo.prompts.
void check_grpo_config(const worker::Config& config, const model::ModelConfig* model);

// The folder of train.checkpoint_dir that holds the SFT warm-up's weights (the run's reference policy).
inline constexpr std::string_view kWarmupFolder = "sft_warmup";
// Whether an entry of train.checkpoint_dir named `name` is one of a GRPO run's checkpoints, which a save replaces
// whole: step_N and its save's leftovers step_N.*, the warm-up's folder and its staging folders.
bool is_checkpoint_entry(std::string_view name);

// The whole run on this rank (collective over `world`, whose size is config.parallel.world()).
GrpoSummary run_grpo(const worker::Config& config, comm::Communicator& world, const GrpoOptions& options = {});

}  // namespace ringtrain::rl
