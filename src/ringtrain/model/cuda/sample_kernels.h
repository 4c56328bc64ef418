// The GPU sampler's kernels (sample_kernels.cu): moving key/value and hidden rows by index, and drawing one token per
// row of fp32 logits. Every call is enqueued on `s`; nothing here synchronises.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ringtrain::model::cuda {

using bf16 = __nv_bfloat16;

// dst row (dst_index ? dst_index[i] : i) = src row (src_index ? src_index[i] : i), for i < n rows of row_elems bf16
// each (indices on the device).
void copy_rows(cudaStream_t s, bf16* dst, const int32_t* dst_index, const bf16* src, const int32_t* src_index,
               int64_t n, int64_t row_elems);

// The rows of decoding step `step` (feeding the token drawn at that step) for prompts of prompt_len[b] tokens, each
// owning `capacity` cache rows: positions[b] = prompt_len[b] + step, slots[b] = b * capacity + positions[b] (the cache
// row its key and value go to), used[b] = positions[b] + 1 (the keys it attends to), or 1 for a finished row
// (finished[b] != 0: its output is never read, so it reads one key instead of its whole cache).
void decode_step_rows(cudaStream_t s, int32_t* positions, int32_t* slots, int32_t* used, const int32_t* prompt_len,
                      const int32_t* finished, int64_t rows, int64_t step, int64_t capacity);

// One draw per row of logits [rows, vocab] (fp32), one block per row:
//  - the policy's log-softmax lp = logits - logsumexp (fp32), before any processing;
//  - greedy (temperature 0, or top_k = 1): the most likely token, the lowest id on a tie; sampling logprob 0;
//  - else the processed distribution: lp / temperature restricted to the top_k largest (ties with the k-th kept),
//    then to the most likely set whose mass reaches top_p (ties with the crossing token kept); both thresholds are
//    found by a 256-ary radix select (4 passes) on the order-preserving uint32 image of the logits, without a sort,
//    its histograms summed in integers, so that the kept set does not depend on the order of atomic additions.
//    The token is the Gumbel-max draw over that set: argmax of lp / temperature + G, G = -log(-log(u)) with u from a
//    counter-based hash of (seed, sample id, step, token id): the draw of a row depends on nothing else.
// Writes token, logprob (lp at the token), sampling_logprob (the processed distribution's, renormalised) and status
// (0 ok, 1 a NaN logit, 2 no finite logit) per row.
struct SampleArgs {
  const float* logits = nullptr;
  int64_t rows = 0, vocab = 0;
  float temperature = 1.f;
  int64_t top_k = 0;
  float top_p = 1.f;
  uint64_t seed = 0;
  const uint64_t* sample_ids = nullptr;  // [rows], device
  int64_t step = 0;
  int32_t* token = nullptr;              // [rows] each, device
  float* logprob = nullptr;
  float* sampling_logprob = nullptr;
  int32_t* status = nullptr;
};
void sample_rows(cudaStream_t s, const SampleArgs& a);

}  // namespace ringtrain::model::cuda
