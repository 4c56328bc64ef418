// `ringtrain bench train`: full training steps (forward and logprobs, loss, backward, gradient reduce-scatter,
// norm and clipping, AdamW, weight all-gather) of a random model through the Trainer, on one GPU or on cp GPUs
// (one process each, a 1 × cp mesh). Device-agnostic: it also runs on the CPU (a tiny model, for a smoke test).
//
// Timing: after warm-up steps, `steps` steps each between a barrier and a device synchronisation (median), then
// `steps` more with a synchronisation at the end of every phase, for the phases' medians (summed over the
// microbatches of a step). FLOPs per step as `bench model` counts them:
//   6 · N · S + 6 · L · S² · heads · head_dim, N = the matmul weights (the LM head once, also when tied)
// and MFU = FLOPs / (step time · GPUs · 989 TFLOP/s).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ringtrain/comm/communicator.h"
#include "ringtrain/model/hf_config.h"

namespace ringtrain::train {

struct BenchTrainOptions {
  model::ModelConfig model;    // see llama_1b_config()
  int64_t seq = 8192;          // tokens of the one sequence of a step
  int steps = 5, warmup = 2;
  std::string loss = "nll";    // nll or pg
  std::string backends;        // the model's attention allow-list; empty: all
  int64_t logprob_chunk = 0;   // 0: the device's default
  uint64_t seed = 1;
};

// The Llama-3.2-1B shape of `bench model`: 16 layers, hidden 2048, 32/8 heads of 64, ffn 8192, vocab 128256, tied.
model::ModelConfig llama_1b_config();
// Random weights as transformers initialises them (N(0, 0.02) matrices, unit norms, zero biases), in layout order,
// from a counter-based hash (fast for a billion values).
std::vector<float> random_weights(const model::ModelConfig& c, uint64_t seed);

// Runs the benchmark on this rank of `world` (its device is the policy's; world.size() = cp). Returns rank 0's row
// (every rank returns its own; times are the slowest rank's).
nlohmann::json run_train_bench(const BenchTrainOptions& o, comm::Communicator& world);

}  // namespace ringtrain::train
