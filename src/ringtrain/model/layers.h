// The model's layers as explicit forward/backward kernels on dense row-major host arrays (llm.c style), one
// layer per .cpp file. T is float (the model) or double (the gradient checks); both are instantiated.
// Backward kernels ADD into their gradient outputs (dx, dw, db): residual branches and the q/k/v projections
// sum into one buffer, and parameter gradients accumulate over micro-batches.
#pragma once

#include <cstdint>
#include <vector>

#include "ringtrain/core/parallel.h"
#include "ringtrain/model/hf_config.h"

namespace ringtrain::model {

// parallel_for over `items` work items of about `cost` multiply-adds each, run serially when the whole loop is
// too small to pay for waking the pool's workers.
template <typename F>
void parallel_items(int64_t items, int64_t cost, F&& fn) {
  constexpr int64_t kMinParallelWork = 1 << 20;
  if (items * cost < kMinParallelWork) {
    for (int64_t i = 0; i < items; ++i) fn(i);
  } else {
    parallel_for(items, fn);
  }
}

// y[n, out] = x[n, in] · w[out, in]^T + b[out] (b may be null); w in the Hugging Face [out, in] layout.
template <typename T>
void linear_forward(T* y, const T* x, const T* w, const T* b, int64_t n, int64_t in, int64_t out);
// dx[n, in] += dy·w (dx may be null); dw[out, in] += dy^T·x; db[out] += Σ_rows dy (db may be null).
template <typename T>
void linear_backward(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w, int64_t n, int64_t in, int64_t out);

// RMSNorm over the last dimension: y = w ∘ x / sqrt(mean(x²) + eps); rstd[row] = 1 / sqrt(mean(x²) + eps).
template <typename T>
void rmsnorm_forward(T* y, T* rstd, const T* x, const T* w, int64_t rows, int64_t dim, double eps);
template <typename T>
void rmsnorm_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, const T* rstd, int64_t rows, int64_t dim);

// RoPE inverse frequencies [head_dim / 2] (fp32 values, as transformers keeps them), llama3 scaling applied.
std::vector<float> rope_inv_freq(const RopeConfig& rope, int64_t head_dim);
// In place on x[tokens, heads, dim] with the rotate-half pairing (i, i + dim/2) at each token's position.
template <typename T>
void rope_forward(T* x, const int32_t* positions, const std::vector<float>& inv_freq, int64_t tokens, int64_t heads,
                  int64_t dim);
// In place on the gradient: the transpose of the rotation.
template <typename T>
void rope_backward(T* dx, const int32_t* positions, const std::vector<float>& inv_freq, int64_t tokens,
                   int64_t heads, int64_t dim);

// h = silu(gate) ∘ up over n elements.
template <typename T>
void swiglu_forward(T* h, const T* gate, const T* up, int64_t n);
// dgate, dup overwritten.
template <typename T>
void swiglu_backward(T* dgate, T* dup, const T* dh, const T* gate, const T* up, int64_t n);

// x[n, dim] = table[tokens[i]]; a token outside [0, vocab) is an error naming it.
template <typename T>
void embedding_forward(T* x, const int32_t* tokens, const T* table, int64_t n, int64_t dim, int64_t vocab);
template <typename T>
void embedding_backward(T* dtable, const int32_t* tokens, const T* dx, int64_t n, int64_t dim);

}  // namespace ringtrain::model
