// Training data of the policy worker: samples read from JSONL or from a safetensors batch file, checked row by row
// against the model and the loss, and the order in which they form global batches.
//
// JSONL: one JSON object per line, no blank lines, no keys other than these (a misspelt key would otherwise train
// silently without its data):
//   input_ids            [S] token ids in [0, vocab), 1 <= S <= policy.max_total_sequence_length
//   token_mask           [S] 0/1: token p is a loss target (predicted from tokens < p; entry 0 is ignored); default 1
//   sample_mask          0/1: 0 leaves the whole sequence out of the loss; default 1
//   advantages           [S] per token, or one number for the whole sample (clipped_pg: required)
//   generation_logprobs  [S] the sampler's logprobs (required with loss_fn.use_importance_sampling_correction)
//   prev_logprobs        [S] the policy's logprobs before this step (absent: the worker computes them)
//   reference_logprobs   [S] the reference policy's logprobs (absent: the worker computes them when needed)
// Logprob arrays follow the logprobs convention: entry p scores token p, entry 0 is unused (0).
// DPO (loss_fn.type dpo): one pair per line, chosen_input_ids, rejected_input_ids and optionally chosen_token_mask,
// rejected_token_mask, chosen_reference_logprobs, rejected_reference_logprobs; it becomes two consecutive samples,
// chosen first. Optional fields are all-or-nothing: present on the first row means required on every row.
//
// safetensors batch (the same samples, faster to read): input_ids I32 [B, S] padded, lengths I32 or I64 [B], and
// optionally token_mask, advantages, generation_logprobs, prev_logprobs, reference_logprobs F32 [B, S] and
// sample_mask F32 [B]; entries past a row's length are ignored. DPO rows alternate chosen, rejected.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "ringtrain/worker/config.h"

namespace ringtrain::worker {

struct Sample {
  std::vector<int32_t> input_ids;
  std::vector<float> token_mask;  // always input_ids.size() entries, 0 or 1
  float sample_mask = 1.0f;
  // Per token (input_ids.size() entries) when present, else empty.
  std::vector<float> advantages, generation_logprobs, prev_logprobs, reference_logprobs;
  int64_t length() const { return static_cast<int64_t>(input_ids.size()); }
  bool operator==(const Sample&) const = default;
};

// What the rows are checked against.
struct DataSpec {
  int64_t vocab = 0;
  int64_t max_length = 0;
  std::string max_length_key = "policy.max_total_sequence_length";  // what sets max_length, for errors
  LossType loss = LossType::Nll;
  bool need_advantages = false;
  bool need_generation_logprobs = false;
};
DataSpec data_spec(const Config& c, const model::ModelConfig& m);

struct Dataset {
  std::vector<Sample> samples;  // DPO: chosen, rejected, chosen, rejected, ...
  bool pairs = false;           // DPO: samples 2i and 2i+1 are one pair
  int64_t units() const { return static_cast<int64_t>(samples.size()) / (pairs ? 2 : 1); }  // sequences or pairs
  int64_t tokens() const;
};

// JSONL text; `source` names it in errors ("FILE:LINE: field: what").
Dataset parse_jsonl(std::string_view text, const std::string& source, const DataSpec& spec);
// A .safetensors file as the batch format, anything else as JSONL.
Dataset load_dataset(const std::filesystem::path& file, const DataSpec& spec);
void write_batch_safetensors(const std::filesystem::path& file, const Dataset& data);

// The order of global batches: every epoch a fresh permutation of the units (sequences, or DPO pairs) from the
// seed, cut into global batches of `global_batch` units (a last partial batch is left out); each dp rank takes
// a contiguous share.
class BatchSchedule {
 public:
  BatchSchedule(int64_t units, int64_t global_batch, uint64_t seed);
  int64_t steps_per_epoch() const { return units_ / global_batch_; }
  // Indices into Dataset::samples (both sequences of a pair, chosen first) of global step `step` (0-based, epochs
  // one after another) for dp rank `dp_rank` of `dp`; global_batch must divide by dp.
  std::vector<int64_t> rank_samples(int64_t step, int64_t dp, int64_t dp_rank, bool pairs) const;
  // The units of global step `step`, in batch order.
  std::vector<int64_t> step_units(int64_t step) const;

 private:
  int64_t units_, global_batch_;
  uint64_t seed_;
};

}  // namespace ringtrain::worker
