// FLOPs of a training step, as the benchmarks (`bench model`, `bench train`, bench/compare_hf_*.py) count them for
// MFU: recomputation under activation checkpointing is not counted.
#pragma once

#include <cstdint>

#include "ringtrain/model/hf_config.h"

namespace ringtrain::model {

// The weights of the matrix products: per layer q, k, v, o and the three MLP matrices; the LM head once (also when
// tied to the embedding).
double matmul_weights(const ModelConfig& c);

// Forward + backward of one sequence of `seq` tokens: 6 · N · S + 6 · L · S² · heads · head_dim.
double train_step_flops(const ModelConfig& c, int64_t seq);

}  // namespace ringtrain::model
