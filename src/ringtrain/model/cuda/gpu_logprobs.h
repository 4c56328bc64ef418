// Token log-probabilities on the GPU: the LM head (bf16 GEMM, fp32 logits) and log-softmax at the targets in fp32,
// chunked over tokens so that only [chunk x vocab] logits exist at a time, and the backward of a loss given
// d(loss)/d(logprob) (logits recomputed per chunk, dlogits rounded to bf16 for the LM-head backward GEMMs, the
// lm_head gradient accumulated in fp32). The model-level functions mirror model/logprobs.h for GpuModel.
//
// Memory: one chunk holds fp32 logits, 4 bytes per (row, vocabulary entry), plus a few floats per row; the
// backward writes the bf16 dlogits over them. default_logprob_chunk() keeps that under kLogprobChunkBytes =
// 896 MiB: at vocab 151,936 that is 1,536 rows (1,536 x 151,936 x 4 B = 890 MiB), at vocab 128,256 1,792 rows:
// under the 1 GiB bar for any number of tokens (32,768 tokens x 151,936 unchunked would be 18.5 GiB of fp32
// logits). Fewer, larger chunks matter: each chunk after the first adds its lm_head gradient into the fp32 sum,
// one read and one write of it.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "ringtrain/model/cuda/gpu_model.h"

namespace ringtrain::model::cuda {

constexpr int64_t kLogprobChunkBytes = int64_t(896) << 20;
// Rows per chunk for this vocabulary: the most (a multiple of 64 when over 64, GEMM-friendly) within the budget.
int64_t default_logprob_chunk(int64_t vocab);

// Device pointers, enqueued on gemm.stream(). out[i] = log P(targets[i] | row i) for rows [n, hidden_dim]; 0 where
// targets[i] < 0. Targets must lie below vocab (checked on the host by the callers below). With `entropy` (optional,
// [n]), entropy[i] = the entropy of row i's whole distribution, from the same pass over the logits.
void token_logprobs(Gemm& gemm, float* out, const bf16* hidden, const bf16* lm_head, const int32_t* targets,
                    int64_t n, int64_t hidden_dim, int64_t vocab, int64_t chunk_tokens, float* entropy = nullptr);
// d_hidden [n, hidden_dim] overwritten with d(loss)/d(hidden); d(loss)/d(lm_head) added into the fp32 d_lm_head
// (written instead when it is fresh).
// The logprobs are recomputed on the way; when `logprobs` is non-null they are written there too, so that a loss
// whose gradient does not depend on them (NLL: d_logprobs known in advance) needs no separate token_logprobs.
void token_logprobs_backward(Gemm& gemm, bf16* d_hidden, GradSlot d_lm_head, const float* d_logprobs,
                             const bf16* hidden, const bf16* lm_head, const int32_t* targets, int64_t n,
                             int64_t hidden_dim, int64_t vocab, int64_t chunk_tokens, float* logprobs = nullptr);

// token_logprobs and token_logprobs_backward in one pass over the logits, for a loss whose d(loss)/d(logprob) at
// a row depends on that row's logprob alone: after each chunk's log-softmax the chunk's logprobs are downloaded,
// `grad` turns them into d(loss)/d(logprob) on the host (first_row: the chunk's first row), and the chunk's backward
// runs from the logits still in place, so the LM head's forward GEMM is not repeated. Writes logprobs (and entropy
// when non-null) [n] on the device, d_hidden, and d_lm_head as token_logprobs_backward does. One host round trip
// per chunk (a few per 8K tokens).
using ChunkGradient =
    std::function<void(int64_t first_row, std::span<const float> logprobs, std::span<float> d_logprobs)>;
void token_logprobs_and_backward(Gemm& gemm, float* logprobs, float* entropy, bf16* d_hidden, GradSlot d_lm_head,
                                 const ChunkGradient& grad, const bf16* hidden, const bf16* lm_head,
                                 const int32_t* targets, int64_t n, int64_t hidden_dim, int64_t vocab,
                                 int64_t chunk_tokens);

// The same with d(loss)/d(logprob) made on the device: grad(first_row, rows, logprobs) enqueues the chunk's gradient
// from its logprobs (device, just written) and returns where it lies, so that nothing waits for the host between
// chunks. The host form above is this with a download and an upload around its ChunkGradient.
using DeviceChunkGradient = std::function<const float*(int64_t first_row, int64_t rows, const float* logprobs)>;
void token_logprobs_and_device_backward(Gemm& gemm, float* logprobs, float* entropy, bf16* d_hidden,
                                        GradSlot d_lm_head, const DeviceChunkGradient& grad, const bf16* hidden,
                                        const bf16* lm_head, const int32_t* targets, int64_t n, int64_t hidden_dim,
                                        int64_t vocab, int64_t chunk_tokens);

// Whole model, host in and out: runs forward and returns log P(targets[i] | tokens up to row i) for the
// [batch * seqlen] rows (this rank's rows under CP).
std::vector<float> model_row_logprobs(GpuModel& model, const int32_t* tokens, const int32_t* positions,
                                      const int32_t* targets, int64_t batch, int64_t seqlen,
                                      SequenceAttention& attention, int64_t chunk_tokens, bool for_backward);
// After model_row_logprobs(..., for_backward = true): adds every weight gradient of a loss with
// d(loss)/d(row logprob) = d_rows (host [batch * seqlen]).
void model_row_logprobs_backward(GpuModel& model, const int32_t* targets, const float* d_rows,
                                 SequenceAttention& attention, int64_t chunk_tokens);

// One sequence on one GPU, in token order: result[0] = 0, result[p] = log P(ids[p] | ids[<p]).
std::vector<float> sequence_logprobs(GpuModel& model, const std::vector<int32_t>& ids, SequenceAttention& attention,
                                     int64_t chunk_tokens, bool for_backward = false);
void sequence_logprobs_backward(GpuModel& model, const std::vector<int32_t>& ids, const std::vector<float>& d_logprobs,
                                SequenceAttention& attention, int64_t chunk_tokens);

}  // namespace ringtrain::model::cuda
