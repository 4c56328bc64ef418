// The model's layers on the GPU: bf16 activations, fp32 statistics and accumulation, fp32 weight gradients
// (the master gradients). Same pairing as the CPU layers (model/layers.h): forward keeps what backward needs;
// backward kernels ADD into fp32 weight gradients and either overwrite or add into activation gradients as
// each signature says. Every call is enqueued on `stream`; nothing here synchronises.
//
// Fused layouts the GPU model uses (one GEMM each instead of three / two):
//  - qkv [n, (hq + 2*hkv) * d]: q heads, then k heads, then v heads of each token;
//  - gate_up [n, 2 * ffn]: gate, then up.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ringtrain::model::cuda {

using bf16 = __nv_bfloat16;

// x[i, :] = table[tokens[i], :]. Tokens must already be checked to lie in [0, vocab) (the caller does it on the
// host, where the error can name the token).
void embedding_forward(cudaStream_t s, bf16* x, const int32_t* tokens, const bf16* table, int64_t n, int64_t dim);
// dtable[tokens[i], :] += dx[i, :] (fp32 atomics: repeated tokens add up).
void embedding_backward(cudaStream_t s, float* dtable, const int32_t* tokens, const bf16* dx, int64_t n,
                        int64_t dim);

// y = w * x / sqrt(mean(x^2) + eps) per row, statistics in fp32; rstd[row] saved for backward.
void rmsnorm_forward(cudaStream_t s, bf16* y, float* rstd, const bf16* x, const bf16* w, int64_t rows, int64_t dim,
                     float eps);
// dx = (accumulate ? dx : 0) + d(x); dw += d(w) in fp32.
void rmsnorm_backward(cudaStream_t s, bf16* dx, bool accumulate, float* dw, const bf16* dy, const bf16* x,
                      const bf16* w, const float* rstd, int64_t rows, int64_t dim);

// From the fused projection qkv [n, (hq + 2 hkv) d] (biases already added) to the attention inputs
// q [n, hq, d], k [n, hkv, d], v [n, hkv, d]: per-head RMSNorm of q and k when q_norm/k_norm are non-null
// (Qwen3; rstd_q [n, hq] and rstd_k [n, hkv] saved), then RoPE (rotate-half pairs (i, i + d/2)) on q and k at
// positions[n] with inv_freq[d/2] (fp32, device).
struct QkvShape {
  int64_t n, heads_q, heads_kv, head_dim;
  float norm_eps;  // used with q_norm/k_norm
};
void qkv_split_forward(cudaStream_t s, const QkvShape& sh, bf16* q, bf16* k, bf16* v, float* rstd_q, float* rstd_k,
                       const bf16* qkv, const bf16* q_norm, const bf16* k_norm, const int32_t* positions,
                       const float* inv_freq);
// The transpose: dqkv [n, (hq + 2 hkv) d] overwritten from dq, dk, dv (un-rotated, through the per-head norms
// when present, whose fp32 weight gradients dq_norm/dk_norm are added to). qkv is the forward's input.
void qkv_split_backward(cudaStream_t s, const QkvShape& sh, bf16* dqkv, float* dq_norm, float* dk_norm,
                        const bf16* dq, const bf16* dk, const bf16* dv, const bf16* qkv, const bf16* q_norm,
                        const bf16* k_norm, const float* rstd_q, const float* rstd_k, const int32_t* positions,
                        const float* inv_freq);

// h[n, ffn] = silu(gate) * up from gate_up [n, 2 ffn] (silu in fp32).
void swiglu_forward(cudaStream_t s, bf16* h, const bf16* gate_up, int64_t n, int64_t ffn);
// dgate_up [n, 2 ffn] overwritten.
void swiglu_backward(cudaStream_t s, bf16* dgate_up, const bf16* dh, const bf16* gate_up, int64_t n, int64_t ffn);

// Token log-probabilities from one chunk of fp32 logits [rows, vocab] (the LM head GEMM's output):
// logprob[r] = logits[r, t] - logsumexp(logits[r, :]) for t = targets[r] >= 0, else 0; lse[r] saved. With
// `entropy` (optional), entropy[r] = the entropy of row r's softmax, from the same pass.
void logprob_rows(cudaStream_t s, float* logprob, float* lse, const float* logits, const int32_t* targets,
                  int64_t rows, int64_t vocab, float* entropy = nullptr);
// d(loss)/d(logits) for d(loss)/d(logprob) = d_logprob: dlogits[r, j] = d_logprob[r] * (onehot(t) - softmax)[j]
// (0 rows where targets[r] < 0), as bf16 for the LM-head backward GEMMs, written over the logits: row r takes the
// first half of row r's fp32 bytes, so the result is a bf16 [rows, vocab] matrix with a row pitch of 2 * vocab
// elements at the returned address (== logits). The LM head needs no second buffer of its own for it.
bf16* logprob_rows_backward_in_place(cudaStream_t s, float* logits, const float* lse, const int32_t* targets,
                                    const float* d_logprob, int64_t rows, int64_t vocab);

}  // namespace ringtrain::model::cuda
