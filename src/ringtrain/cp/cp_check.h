// Whole-sequence attention problems run two ways: context-parallel on in-process CPU ranks (shard, CP forward
// and backward, unshard) and on the single-rank fp64 math reference. Used by `ringtrain attention-check` and
// the CP tests.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "ringtrain/attention/backend.h"
#include "ringtrain/cp/cp_attention.h"

namespace ringtrain::cp {

struct AttnProblem {
  int64_t batch = 1, seq = 0, heads_q = 1, heads_kv = 1, head_dim = 64;
  bool causal = true;
  DType dtype = DType::F32;
  std::string describe() const;
};

// Whole-sequence host tensors: q [B,S,Hq,D], k/v [B,S,Hkv,D], dout like q, all of the problem's dtype.
struct AttnInputs {
  Tensor q, k, v, dout;
};
// Whole-sequence host results: o, dq, dk, dv (problem dtype; fp64 for the reference) and lse [B,Hq,S] fp32.
struct AttnResults {
  Tensor o, lse, dq, dk, dv;
  double forward_seconds = 0, backward_seconds = 0;  // wall time (CP: rank 0, between barriers)
};

AttnInputs random_inputs(const AttnProblem& prob, uint64_t seed);
// The CPU math backend with fp64 accumulation on the unsharded sequence (called directly, not through selection).
AttnResults reference_attention(const AttnProblem& prob, const AttnInputs& in);
// The same computation in the problem's dtype (fp32 accumulation, outputs rounded to the dtype): its error against
// reference_attention is the rounding error the problem itself has, the scale for error_bound.
AttnResults dtype_reference_attention(const AttnProblem& prob, const AttnInputs& in);
// The largest relative error (against reference_attention) a correct run in `dtype` may have, given the relative
// error of dtype_reference_attention on the same inputs.
double error_bound(DType dtype, double dtype_reference_error);

struct CpRunOptions {
  int cp = 1;
  CpConfig config;
  std::chrono::milliseconds timeout{60000};
  // When not empty, every rank runs the CP calls inside BackendScope("model", model_scope): the situation of
  // the original bug (a model that allows every backend, inside the CP restriction).
  std::vector<attention::BackendId> model_scope;
  bool keep_kv = true;  // hand the forward's last KV block to the backward (KeptKv), as a training step would
};
// Shards the inputs, runs CP forward then backward on opt.cp in-process ranks and unshards the results
// (outputs poisoned with NaN before the run). Throws if a rank's padding rows are not O = 0, LSE = -inf and zero
// gradients, and rethrows the root cause when a rank fails.
AttnResults cp_attention_on_ranks(const AttnProblem& prob, const AttnInputs& in, const CpRunOptions& opt);

// ||got - ref||_2 / ||ref||_2 over all elements (host views of one shape); +inf when got has a NaN/inf where ref
// is finite, so a poisoned element never passes. Matching infinities (LSE of rows with no key) count as equal.
double relative_error(const TensorView& got, const TensorView& ref);

}  // namespace ringtrain::cp
