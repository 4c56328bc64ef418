// The two forward-only products of a scoring call with what consumes them fused into the GEMM's epilogue (sm_90a,
// fused_gemm_sm90.cu), so that neither product's output is written to memory and read back:
//  - the MLP's gate/up projection with SwiGLU: act = silu(x · gateᵀ) ∘ (x · upᵀ) straight from the fp32
//    accumulators, so the [n, 2 ffn] pre-activations (and the SwiGLU pass over them) do not exist;
//  - the LM head with its log-softmax: per row and 128-column tile, the tile's (max, Σ exp, Σ exp · (z - max)) and
//    the target's logit, merged per row by a small kernel: 16 bytes per 128 vocabulary entries instead of 512 bytes
//    of fp32 logits.
// Training keeps the unfused path (cuBLASLt, layer_kernels.h, logprob_rows): its backward reads the
// pre-activations and the logits. The two paths differ by rounding: here the SwiGLU inputs are not rounded to bf16
// first.
//
// The GEMM is persistent: one CTA per SM, a producer warp issuing TMA copies of 128 x 64 tiles of both operands
// into a 6-stage mbarrier ring, two consumer warpgroups each owning alternate 128 x 128 output tiles, so that one
// runs its epilogue while the other's main loop has the tensor cores.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ringtrain::model::cuda {

// True when the current device is a Hopper GPU (sm_90) and RINGTRAIN_FUSED_EPILOGUES is not "0" (the switch that
// makes scoring take the unfused path, for comparisons).
bool fused_epilogues_enabled();

// act[n, ffn] = silu(g) * u with g = x · w_gate_upᵀ[:ffn], u = x · w_gate_upᵀ[ffn:], for x [n, in] and
// w_gate_up [2 ffn, in] (gate rows, then up rows), all row-major bf16. Needs in % 8 == 0, ffn % 8 == 0 and
// 16-byte-aligned pointers (fused_swiglu_fits); enqueued on `s`.
bool fused_swiglu_fits(const __nv_bfloat16* act, const __nv_bfloat16* x, const __nv_bfloat16* w_gate_up, int64_t in,
                       int64_t ffn);
void fused_gate_up_swiglu(cudaStream_t s, __nv_bfloat16* act, const __nv_bfloat16* x, const __nv_bfloat16* w_gate_up,
                          int64_t n, int64_t in, int64_t ffn);

// out[i] = log softmax(hidden[i] · lm_headᵀ)[targets[i]] (0 where targets[i] < 0; targets below vocab), and with
// `entropy` (optional) the entropy of row i's distribution, for hidden [n, in] and lm_head [vocab, in]. `scratch`
// holds fused_logprob_scratch_floats(n, vocab) floats, 16-byte aligned. Needs in % 8 == 0 and 16-byte-aligned
// hidden and lm_head (fused_logprobs_fit).
bool fused_logprobs_fit(const __nv_bfloat16* hidden, const __nv_bfloat16* lm_head, int64_t in);
int64_t fused_logprob_scratch_floats(int64_t n, int64_t vocab);
void fused_token_logprobs(cudaStream_t s, float* out, float* entropy, const __nv_bfloat16* hidden,
                          const __nv_bfloat16* lm_head, const int32_t* targets, int64_t n, int64_t in, int64_t vocab,
                          float* scratch);

}  // namespace ringtrain::model::cuda
