// Checkpoints of training state (docs/DESIGN.md "Training"): a folder that transformers can load as a model and
// that a Trainer of any dp × cp mesh and any device can resume from.
//
//   DIR/config.json                         the model (Hugging Face)
//   DIR/model.safetensors                   the compute weights by Hugging Face name; above max_shard_bytes
//                                           model-0000k-of-0000n.safetensors + model.safetensors.index.json
//   DIR/optimizer/rank-0000r-of-0000w.safetensors
//                                           rank r's shard: for every Hugging Face tensor its flat shard covers,
//                                           "master@NAME@START", "exp_avg@NAME@START", "exp_avg_sq@NAME@START" (1-D,
//                                           elements START .. START+len of the tensor in row-major order)
//   DIR/tokenizer.json, ...                 CheckpointOptions::companions (model::hf_companion_files)
//   DIR/trainer_state.json                  step, optimizer steps, schedule position, data position, RNG state, the
//                                           mesh, the model's config (fingerprint), and every file with its size
//
// Loading re-shards by name: each rank takes the element ranges of its new shard from whichever pieces hold them,
// so the saving and loading meshes (and the CPU and GPU flat orders) need not match.
//
// Saving writes everything into DIR.saving (a sibling), then renames it to DIR, or atomically exchanges it with an
// existing DIR that is a checkpoint (a directory holding trainer_state.json; anything else is never replaced) and
// removes the old one. A save that dies midway leaves the previous checkpoint whole. The folder must be on a file
// system every rank sees.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ringtrain/model/hf_config.h"
#include "ringtrain/train/trainer.h"

namespace ringtrain::train {

// What the caller's data pipeline needs to resume: the position in the data and its RNG state (any text, e.g. a
// std::mt19937_64 written with operator<<).
struct TrainingProgress {
  int64_t epoch = 0;
  int64_t index = 0;  // next sample of the epoch
  std::string rng;
};

struct CheckpointOptions {
  int64_t max_shard_bytes = int64_t{5} << 30;  // weights above this are split into shards (as transformers does)
  // Called after each file of the save is complete (on the rank that wrote it); a throw aborts the save.
  std::function<void(const std::filesystem::path&)> after_file;
  // The tokenizer and generation files the checkpoint carries beside the weights (not needed to resume).
  model::CompanionFiles companions;
};

// Collective over the trainer's world; every rank gets the same error when any rank fails.
void save_training_checkpoint(const std::filesystem::path& dir, Trainer& trainer, const TrainingProgress& progress,
                              const CheckpointOptions& options = {});
// A save's leftover beside its checkpoint (DIR.saving of a save that died, DIR.old of an exchange that died), which a
// later save of DIR would remove: an error naming it when it is not ours to remove. Other names pass.
void check_save_leftover(const std::filesystem::path& path);
// Removes the leftovers of saves that died from folder `dir` (each X.saving or X.old that is ours and that no save
// is writing now); returns what it removed. A run calls it once it holds its checkpoint folder, so that a kill late
// in a large save does not leave gigabytes until that step is saved again.
std::vector<std::filesystem::path> remove_save_leftovers(const std::filesystem::path& dir);
// An error naming `config_file` (a checkpoint's config.json) and the first key that differs unless it describes the
// model of `policy_config` (its storage dtype and special token ids aside).
void check_same_model(const std::filesystem::path& config_file, const model::ModelConfig& policy_config);
// The learning-rate schedule a checkpoint's run trained with (recorded in its trainer_state.json), or nullopt for a
// checkpoint that records none. Errors name the file and the key.
std::optional<ScheduleConfig> saved_schedule(const std::filesystem::path& dir);
// Collective; the trainer's policy must have the checkpoint's model. Restores the weights (from the master
// shards), the optimizer state, the step counters and the schedule; returns the data position and RNG state.
// Errors name the file and the mismatch (missing or truncated file, another model, a piece out of range, an
// element no piece covers).
TrainingProgress load_training_checkpoint(const std::filesystem::path& dir, Trainer& trainer);

}  // namespace ringtrain::train
