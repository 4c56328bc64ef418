// `ringtrain bench rollouts`: the policy worker's get_logprobs and train on a rollout mix (N sequences, lengths
// log-uniform in [min_len, max_len], random tokens, all from one seed), in these microbatch layouts:
//   packed   policy.sequence_packing: first-fit-decreasing bins of mb_tokens tokens, each bin one packed row
//   padded   no packing, no dynamic batching: runs of padded_batch sequences in batch order, padded to the longest
//   dynamic  (optional) policy.dynamic_batching: length buckets of at most mb_tokens padded tokens
//   long     the mix's total token count as sequences of long_len tokens (the last one shorter; one sequence when
//            the total fits), packed like the packed row: what the same tokens cost without document boundaries
// Each layout gets its own worker (the same weights: the same model and seed); warm-up calls, then the median wall
// time of `iters` calls. The worker's methods return host results, so on a GPU every timed call ends synchronised.
// train is one optimizer step over the whole batch (train_global_batch_size = the batch's sequences).
//
// Per row: real tokens (counted from the samples), tokens the forward processes (padding included, from the
// worker's microbatch plan), microbatches, seconds and real tokens/s; then packed/padded and packed/long ratios.
// The logprobs of the packed and padded layouts (their first call, before any train step) are compared: the largest
// absolute difference goes into the report; train rows carry the first step's loss and gradient norm (every layout
// takes that step from the same weights, so they agree up to rounding).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ringtrain/comm/communicator.h"
#include "ringtrain/worker/config.h"
#include "ringtrain/worker/policy_worker.h"

namespace ringtrain::worker {

struct BenchRolloutsOptions {
  std::string model_name;  // policy.model_name: a checkpoint folder or builtin:<name>
  Device device = Device::cpu();
  int64_t sequences = 256, min_len = 64, max_len = 16384;
  uint64_t seed = 1;              // the lengths, the tokens, the advantages and builtin weights
  int64_t mb_tokens = 16384;      // packed budget (logprob_mb_tokens = train_mb_tokens), at least max_len
  int64_t padded_batch = 4;       // logprob_batch_size and train_micro_batch_size of the padded layout
  int64_t long_len = 0;           // tokens per sequence of the long layout; 0 = mb_tokens
  bool dynamic = false;           // also the dynamic-batching layout (budget mb_tokens padded tokens)
  bool train = true;              // also time train steps (else get_logprobs only)
  std::string loss = "nll";       // nll or clipped_pg (advantages +-1, prev_logprobs from the layout's scoring)
  int iters = 3, warmup = 1;
  std::vector<attention::BackendId> backends;  // attention.backends; empty = all
  int64_t logprob_chunk = 0;                   // policy.logprob_chunk_size
  bool activation_checkpointing = false;
};

// The mix's lengths: exp(uniform(log min_len, log max_len)) rounded, clamped to [min_len, max_len]; deterministic
// in the seed.
std::vector<int64_t> rollout_lengths(int64_t n, int64_t min_len, int64_t max_len, uint64_t seed);

// The config of one layout ("packed", "padded", "dynamic", "long") for a batch of `sequences` sequences of at most
// `max_length` tokens (policy.max_total_sequence_length).
Config rollouts_layout_config(const BenchRolloutsOptions& o, const std::string& layout, int64_t sequences,
                              int64_t max_length);

// Runs the benchmark on this rank of `world` (size 1: one device). Returns the report (see bench_rollouts.cpp's
// fields); with `logprobs`, each layout's first get_logprobs result by layout name.
nlohmann::json run_rollouts_bench(const BenchRolloutsOptions& o, comm::Communicator& world,
                                  std::map<std::string, LogprobResult>* logprobs = nullptr);

}  // namespace ringtrain::worker
