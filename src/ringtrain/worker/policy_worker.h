// The policy worker: what an RL loop (or `ringtrain train`) drives. One worker per rank of the dp × cp mesh; every
// rank calls every method with the same arguments (the global batch), the worker takes its own part.
//
// Made from a Config (config.h): the model (a checkpoint folder or a builtin one), the mesh, the attention
// allow-list, the loss, the optimizer and the schedule. Every check that needs no weights runs before any weight is
// loaded (Config::validate, Config::validate_against on config.json).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ringtrain/comm/communicator.h"
#include "ringtrain/core/stop_request.h"
#include "ringtrain/model/policy.h"
#include "ringtrain/train/checkpoint.h"
#include "ringtrain/train/trainer.h"
#include "ringtrain/worker/config.h"
#include "ringtrain/worker/data.h"

namespace ringtrain::worker {

// Per sequence of the batch, in token order: logprobs[b][0] = 0, padding never appears (each sequence keeps its own
// length); entropy only when asked for.
struct LogprobResult {
  std::vector<std::vector<float>> logprobs;
  std::vector<std::vector<float>> entropy;
};

// A batch read where it lies: sequence i is row i of the integer [B, C] view `ids` (I32 or I64, any strides), its
// first lengths[i] entries. On the policy's GPU the ids are read in place: they never cross to the host.
struct TokenRowsBatch {
  TensorView ids;
  std::vector<int64_t> lengths;
};

// A train batch read where it lies: the rows of `tokens`, and views of [B, S] (token_mask, the logprobs), [B]
// (sample_mask) or either (advantages), empty when absent, with Sample's meaning (data.h) for the whole batch. On the
// policy's GPU the per-token values never cross to the host (train::Trainer::step(TrainRows)).
struct TrainRowsBatch {
  TokenRowsBatch tokens;
  TensorView token_mask, sample_mask, advantages, generation_logprobs, prev_logprobs, reference_logprobs;
};

struct TrainResult {
  train::StepResult step;        // loss, grad norm, lr, global valid tokens / sequences, metrics, skipped
  double tokens_per_second = 0;  // all tokens of the global batch over the step's wall time
  double seconds = 0;
};

// One entry per Hugging Face tensor, for an inference engine that takes the weights by name.
struct RefitEntry {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype;
};

// The starting weights of the workers of one process (fp32, layout order), loaded once and shared read-only by the
// in-process ranks that ask while an earlier copy is still held: N CPU ranks hold one copy of the reference weights,
// not N, and ranks that only score read it in place (make_policy over shared weights). Thread-safe.
// The trainer's settings that config `c` gives (losses, AdamW, the learning-rate schedule, microbatching).
train::TrainerConfig trainer_config(const Config& c);

class StartingWeights {
 public:
  // policy.model_name's weights (a builtin model's from train.seed) for the config's model.
  std::shared_ptr<const std::vector<float>> get(const Config& c, const model::ModelConfig& m);

 private:
  std::mutex mu_;
  std::map<std::string, std::weak_ptr<const std::vector<float>>> held_;
};

class PolicyWorker {
 public:
  // world: this rank's communicator over all dp · cp ranks (in-process or NCCL); its size must equal
  // config.parallel.world(). Not owned; it must outlive the worker. weights: shared by this process's ranks (not
  // owned; it must outlive the constructor), or null to load the starting weights for this worker alone. stop: when
  // given (on every rank or on none; not owned), scoring and training check it before each microbatch (agreed over
  // the cp group: one all-reduce of one integer each when cp > 1) and stop there, every rank together, with
  // comm::Interrupted, having changed no weight and no counter (results written in place are then incomplete).
  PolicyWorker(const Config& config, comm::Communicator& world, StartingWeights* weights = nullptr,
               const StopRequest* stop = nullptr);
  ~PolicyWorker();

  const model::ModelConfig& model_config() const;
  model::Policy& policy();
  train::Trainer& trainer();  // step counters, the optimizer shard (made here when no step or load made it yet)
  int64_t steps_taken() const;  // the trainer's steps; 0 before any (never makes the trainer)
  const train::Mesh& mesh() const;

  // Scores the samples: each dp rank its contiguous share, in the microbatches of plan_microbatches(Pass::Score)
  // (logprob_batch_size sequences, length buckets, or packed bins, each bin one packed row); every rank returns
  // the whole batch in input order. Checks every sample first (lengths within max_total_sequence_length, token
  // ids, field lengths).
  LogprobResult get_logprobs(const std::vector<Sample>& samples, bool with_entropy = false);
  // The same under the frozen reference weights (the weights the worker started from), kept in host memory (one
  // copy for the in-process ranks sharing StartingWeights). On a GPU, or in fp64, they are uploaded into the
  // policy's buffers for the call once training state exists (before that the policy holds them already; the first
  // upload also keeps them in host memory as the compute weights' bytes, which later calls upload as they are), and
  // the trained weights are rewritten afterwards from the optimizer's master shards on the device: never a second
  // copy on the GPU, no download. An fp32 CPU policy scores with a second policy that reads them in place.
  LogprobResult get_reference_logprobs(const std::vector<Sample>& samples);
  // The same scores written into contiguous float32 [B, C] views of ids' shape (on any device): [i, p] = the logprob
  // of token p of sequence i for 1 <= p < lengths[i], 0 everywhere else; `entropy` likewise when it has data. With
  // the ids and the views on the policy's GPU nothing crosses to the host but the verdict of the token-id check.
  // Checked as get_logprobs checks samples. Complete when it returns.
  void get_logprobs_into(const TokenRowsBatch& batch, const TensorView& logprobs, const TensorView& entropy = {});
  void get_reference_logprobs_into(const TokenRowsBatch& batch, const TensorView& logprobs);
  // One optimizer step on the global batch (exactly train_global_batch_size sequences, DPO: pairs as consecutive
  // chosen, rejected) with the configured loss. prev_logprobs (clipped_pg) and reference_logprobs (dpo, or clipped_pg
  // with a KL penalty) are computed here for samples that lack them. Each dp rank's part goes in the microbatches of
  // plan_microbatches(Pass::Train): train_micro_batch_size units, length buckets, or packed bins (one packed row each).
  TrainResult train(const std::vector<Sample>& samples);
  // The same step from a batch on the policy's GPU; prev_logprobs and reference_logprobs that the loss needs and the
  // batch lacks are scored here into device memory (get_logprobs_into, get_reference_logprobs_into). Checked as
  // train() checks samples, the token ids and masks on the device. A policy on the host: an error.
  TrainResult train_rows(const TrainRowsBatch& batch);

  // Training state (checkpoint.h): weights, optimizer shards, counters, data position, and the tokenizer and
  // generation files of policy.model_name's folder as the worker read them at its start. load() leaves the reference
  // weights as they were (the config's model).
  void save(const std::filesystem::path& dir, const train::TrainingProgress& position = {});
  train::TrainingProgress load(const std::filesystem::path& dir);
  // The current weights as a Hugging Face checkpoint (config.json + safetensors, and the tokenizer and generation
  // files of policy.model_name's folder as the worker read them at its start), written atomically by rank 0 (write_hf_folder); collective: every rank
  // returns or throws rank 0's error.
  void export_hf(const std::filesystem::path& dir);
  // The tensors an inference engine receives, in layout order (a tied lm_head is served by the embedding), with the
  // dtype of the compute weights (fp32 for an fp64 policy).
  std::vector<RefitEntry> refit_info() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// config.json + model.safetensors (in config.dtype) and `companions`, written into DIR.exporting, then renamed to DIR;
// an existing DIR is replaced only when it is a directory holding nothing but such files (an earlier export) or
// nothing.
void write_hf_folder(const std::filesystem::path& dir, const model::ModelConfig& config,
                     const std::vector<float>& values, const model::CompanionFiles& companions = {});

}  // namespace ringtrain::worker
