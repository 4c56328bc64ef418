// The run configuration of the policy worker: a YAML file with NeMo RL's key names (policy.*,
// loss_fn.*) and ringtrain's own sections (attention, parallel, device, train), plus dotted command-line
// overrides (`policy.train_micro_batch_size=2`). One struct per section, every field with a default and a one-line
// doc (config.cpp's schema holds the docs, printed back by to_yaml).
//
// Reading checks every key against the schema (an unknown key is an error naming its full path and the nearest
// known key), every value's type and range (errors name the key, the value and FILE:LINE), then validate() checks
// what needs no weights: the mesh, batch divisibility, lengths and budgets. validate_against() adds the checks that
// need the model's config.json (heads, positions, windows) and runs before any weight is read.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "ringtrain/attention/backend.h"
#include "ringtrain/core/tensor.h"
#include "ringtrain/cp/cp_attention.h"
#include "ringtrain/model/hf_config.h"

namespace ringtrain::worker {

// Auto: bfloat16 on a GPU, float32 on the CPU (resolved when the config is read).
enum class Precision { Auto, BFloat16, Float32, Float64 };
enum class LossType { Nll, ClippedPg, Dpo };
enum class KlType { K1, K2, K3 };
enum class ScheduleKind { Constant, Cosine };

struct DTensorConfig {
  bool activation_checkpointing = false;
  // Accepted so NeMo RL's configs load; ringtrain runs only their default values.
  int64_t tensor_parallel_size = 1;
  bool sequence_parallel = false;
  bool cpu_offload = false;
  bool operator==(const DTensorConfig&) const = default;
};

struct SequencePackingConfig {
  bool enabled = false;
  int64_t train_mb_tokens = 0;    // token budget of one packed training row; 0 = max length (DPO: twice)
  int64_t logprob_mb_tokens = 0;  // token budget of one packed scoring row; 0 = train_mb_tokens
  std::string algorithm = "first_fit_decreasing";
  bool operator==(const SequencePackingConfig&) const = default;
};

// Microbatches cut by a token budget from length-sorted sequences, each padded to its longest sequence.
struct DynamicBatchingConfig {
  bool enabled = false;
  int64_t train_mb_tokens = 0;    // padded tokens per training microbatch; 0 = max length x train_micro_batch_size
  int64_t logprob_mb_tokens = 0;  // padded tokens per scoring microbatch; 0 = max length x logprob_batch_size
  bool operator==(const DynamicBatchingConfig&) const = default;
};

struct OptimizerConfig {  // AdamW
  double lr = 5e-6;
  double weight_decay = 0.01;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  bool operator==(const OptimizerConfig&) const = default;
};

struct SchedulerConfig {
  int64_t warmup_steps = 0;  // linear warm-up from lr/warmup_steps to lr over this many optimizer steps
  ScheduleKind kind = ScheduleKind::Constant;
  double min_lr = 0.0;      // the cosine schedule's floor
  // The cosine schedule's length (warm-up included); 0 = the run's steps (train.steps; `ringtrain train` cuts them to
  // train.epochs of its data).
  int64_t total_steps = 0;
  bool operator==(const SchedulerConfig&) const = default;
};

struct PolicyConfig {
  std::string model_name;                // a checkpoint folder, or builtin:<name> (builtin_model_names())
  int64_t train_global_batch_size = 32;  // sequences (DPO: pairs) per optimizer step, over all dp ranks
  int64_t train_micro_batch_size = 4;    // sequences (DPO: pairs) per forward/backward on one dp rank
  int64_t logprob_batch_size = 4;        // sequences per scoring call
  int64_t max_total_sequence_length = 4096;
  Precision precision = Precision::Auto;
  double max_grad_norm = 1.0;      // clip by the global L2 norm; 0 = no clipping
  int64_t logprob_chunk_size = 0;  // tokens per LM-head chunk; 0 = the device's default
  DTensorConfig dtensor_cfg;
  SequencePackingConfig sequence_packing;
  DynamicBatchingConfig dynamic_batching;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  bool operator==(const PolicyConfig&) const = default;
};

struct LossConfig {
  LossType type = LossType::Nll;
  // clipped_pg: weight of the KL(current || reference) term; dpo: the beta of -log sigmoid(beta * reward margin).
  double reference_policy_kl_penalty = 0.0;
  KlType reference_policy_kl_type = KlType::K3;
  double ratio_clip_min = 0.2;  // the ratio is clipped to [1 - ratio_clip_min, 1 + ratio_clip_max]
  double ratio_clip_max = 0.2;
  std::optional<double> ratio_clip_c;               // dual clip for negative advantages (> 1); unset = off
  bool use_importance_sampling_correction = false;  // weight tokens by exp(prev - generation logprobs)
  bool token_level_loss = true;         // sum over tokens / global valid tokens; false: mean per sequence / sequences
  double preference_loss_weight = 1.0;  // dpo
  double sft_loss_weight = 0.0;         // dpo: weight of the NLL of the chosen responses
  bool operator==(const LossConfig&) const = default;
};

struct ParallelConfig {
  int64_t dp = 1;
  int64_t cp = 1;  // also readable as policy.dtensor_cfg.context_parallel_size
  cp::CpComm cp_comm = cp::CpComm::Ring;
  int64_t world() const { return dp * cp; }
  bool operator==(const ParallelConfig&) const = default;
};

struct TrainConfig {
  int64_t steps = 0;             // optimizer steps; 0 = as many as `epochs` passes over the data give
  int64_t epochs = 1;            // passes over the data (train); 0 = no limit; the first limit reached ends the run
  std::string data;              // JSONL rows (data.h) or a .safetensors batch file
  std::string checkpoint_dir;    // empty = no checkpoints
  int64_t checkpoint_every = 0;  // optimizer steps between checkpoints; 0 = only at the end
  bool checkpoint_on_stop = true;  // a run stopped by a signal saves its finished steps first (with checkpoint_dir)
  std::string metrics_dir;       // metrics.jsonl and TensorBoard events; empty = none
  uint64_t seed = 0;
  bool operator==(const TrainConfig&) const = default;
};

// The GRPO loop of `ringtrain grpo` (rl/grpo.h). Its optimizer steps are train.steps; one step's batch is
// num_prompts_per_step x num_generations_per_prompt sequences, which must equal policy.train_global_batch_size.
struct GrpoConfig {
  std::string prompts;  // builtin:reverse_digits or a JSONL prompt file; empty = not a GRPO run
  int64_t num_prompts_per_step = 8;
  int64_t num_generations_per_prompt = 8;
  double temperature = 1.0;  // 0 = greedy (every sample of a group the same)
  double top_p = 1.0;
  int64_t top_k = 0;  // 0 = all tokens
  int64_t max_new_tokens = 16;
  std::string reward = "partial";  // partial or exact (rl/task.h)
  int64_t sft_warmup_steps = 0;    // NLL steps on the reference answers before GRPO
  double sft_warmup_lr = 0.0;      // 0 = policy.optimizer.kwargs.lr
  bool normalize_rewards = true;   // advantages divided by their group's reward std (off: Dr. GRPO)
  bool use_leave_one_out_baseline = false;  // a sample's baseline is the mean of the other samples of its group
  int64_t val_period = 0;                   // validate every N GRPO steps and after the last; 0 = never
  bool val_at_start = false;                // validate before the first GRPO step
  int64_t max_val_samples = 256;            // held-out prompts per validation
  std::string val_prompts;  // held-out prompts: a JSONL file; empty = the built-in task's own held-out stream
  bool validates() const { return val_period > 0 || val_at_start; }
  bool operator==(const GrpoConfig&) const = default;
};

// The device when the config names none (or says auto): the first GPU when this build can run on it, else the CPU.
Device auto_device();

// What a config is read for: a run of `ringtrain train` / `grpo` (its data: train.data or grpo.prompts is required),
// or a worker alone (a loop outside, e.g. in Python, brings the batches: neither is required).
enum class ConfigUse { Run, Worker };

struct Config {
  PolicyConfig policy;
  LossConfig loss_fn;
  std::vector<attention::BackendId> attention_backends;  // attention.backends; empty = every backend
  ParallelConfig parallel;
  Device device = auto_device();
  TrainConfig train;
  GrpoConfig grpo;

  // Checks that need no model or data (mesh, batch divisibility, lengths, ranges across fields); errors name the
  // keys and values involved.
  void validate(ConfigUse use = ConfigUse::Run) const;
  // Checks against the model's config.json, before weights are read: heads divisible by cp for a2a, the lengths
  // within the model's positions and sliding window.
  void validate_against(const model::ModelConfig& model) const;
  // The checks of the grpo section against the rest (train.steps, the batch = prompts x samples): validate() runs them
  // when grpo.prompts is set without train.data (a GRPO run), `ringtrain grpo` always.
  void validate_grpo() const;

  // The compute dtype of the policy.
  DType compute_dtype() const;
  // Sequences per dp rank per optimizer step (DPO: both sequences of every pair).
  int64_t local_batch_sequences() const;
  // Tokens per training / scoring microbatch, defaults resolved: packed tokens with sequence_packing, padded tokens
  // (sequences x longest) with dynamic_batching, 0 when microbatches hold a fixed number of sequences.
  int64_t train_mb_tokens() const;
  int64_t logprob_mb_tokens() const;
  int64_t total_scheduler_steps() const;  // scheduler.total_steps, else train.steps
  bool operator==(const Config&) const = default;
};

// Reads FILE, applies the overrides in order ("a.b.c=VALUE", VALUE a YAML scalar or flow list), checks types and
// ranges and runs validate(). Every error names FILE:LINE (or the override) and the key.
Config load_config(const std::filesystem::path& file, const std::vector<std::string>& overrides = {},
                   ConfigUse use = ConfigUse::Run);
// The same from YAML text; `source` names it in errors.
Config parse_config(const std::string& yaml_text, const std::string& source,
                    const std::vector<std::string>& overrides = {}, ConfigUse use = ConfigUse::Run);
// The resolved config as YAML with every key (a comment per field with its doc); parse_config reads it back equal.
std::string to_yaml(const Config& c);

// The model's configuration: config.json of the checkpoint folder, or the embedded shape of builtin:<name> (whose
// weights are random_params(ParamLayout(config), train.seed)).
model::ModelConfig resolve_model_config(const PolicyConfig& policy);
bool is_builtin_model(const std::string& model_name);
std::vector<std::string> builtin_model_names();

std::string_view precision_name(Precision p);
std::string_view loss_type_name(LossType t);

}  // namespace ringtrain::worker
