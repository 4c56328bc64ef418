// The forward/backward harness of the attention checks and benchmarks: one whole-sequence attention problem, its
// inputs drawn from a seed, run on a backend (one device) or context-parallel (in-process CPU ranks here, GPU ranks
// in device_checks.h), compared with a reference. Used by `ringtrain attention-check`, `ringtrain bench attention`
// and `ringtrain bench cp`, and by the CP tests.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ringtrain/attention/backend.h"
#include "ringtrain/cp/cp_attention.h"

namespace ringtrain::check {

struct AttnProblem {
  int64_t batch = 1, seq = 0, heads_q = 1, heads_kv = 1, head_dim = 64;
  bool causal = true;
  DType dtype = DType::F32;
  int64_t window = 0;  // sliding window in keys (AttnParams::window; causal only), 0: none
  std::string describe() const;
  attention::MaskType mask() const { return causal ? attention::MaskType::CausalTopLeft : attention::MaskType::None; }
  // The params of a call on (q, k) of this problem: its mask and window.
  attention::AttnParams params(const TensorView& q, const TensorView& k) const;
  // 4*B*Hq*S*S*D for the forward, halved when causal (as bench/compare_torch.py counts it); with a window w < S,
  // 4*B*Hq*(S*w - w*w/2)*D, the same approximation of the keys seen; a training step's forward+backward counts 3.5
  // times that.
  double forward_flops() const;
};

// Inputs, outputs and gradients of one problem on one device for `len` positions: q/dout/o/dq [B,len,Hq,D] and
// k/v/dk/dv [B,len,Hkv,D] of the problem's dtype, lse [B,Hq,len] fp32.
struct AttnBuffers {
  Tensor q, k, v, dout, o, lse, dq, dk, dv;
  AttnBuffers(const AttnProblem& p, int64_t len, Device dev);
  attention::AttnForwardArgs forward_args() const;
  attention::AttnBackwardArgs backward_args() const;
  void poison_outputs() const;  // NaN into o, lse, dq, dk, dv: an element a kernel forgets fails the comparison
  // Draws q, k, v and dout from the seed (fill_normal_hashed: the same values on every device and rank).
  void fill_inputs(uint64_t seed) const;
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
// The selected backend on the whole sequence on `dev` (inside a context-parallel scope of size 1): device copies of
// the inputs, results copied back to the host; wall times with the device synchronised.
AttnResults attention_on_device(const AttnProblem& prob, const AttnInputs& in, Device dev);

struct CpRunOptions {
  int cp = 1;
  cp::CpConfig config;
  std::chrono::milliseconds timeout{60000};
  // When not empty, every rank runs the CP calls inside BackendScope("model", model_scope): a model scope
  // that tries to widen (a model that allows every backend, inside the CP restriction).
  std::vector<attention::BackendId> model_scope;
  bool keep_kv = true;  // hand the forward's last KV block to the backward (KeptKv), as a training step would
};
// Shards the inputs, runs CP forward then backward on opt.cp in-process ranks and unshards the results
// (outputs poisoned with NaN before the run). Throws if a rank's padding rows are not O = 0, LSE = -inf and zero
// gradients, and rethrows the root cause when a rank fails.
AttnResults cp_attention_on_ranks(const AttnProblem& prob, const AttnInputs& in, const CpRunOptions& opt);

// ||got - ref||_2 / ||ref||_2 over all elements (views of one shape, on any device); +inf when got has a NaN/inf
// where ref is finite, so a poisoned element never passes. Matching infinities (LSE of rows with no key) count as
// equal.
double relative_error(const TensorView& got, const TensorView& ref);
// The squared sums behind relative_error, {sum (got-ref)^2, sum ref^2}, for errors gathered over ranks; the first is
// +inf when relative_error would be.
std::pair<double, double> error_sums(const TensorView& got, const TensorView& ref);

// The relative errors of O, LSE, dQ, dK, dV against a reference, each judged against its tolerance.
struct ParityReport {
  struct Row {
    std::string name;
    double error = 0, tolerance = 0;
  };
  std::vector<Row> rows;  // in the order O, LSE, dQ, dK, dV
  bool pass() const;      // every error <= its tolerance (NaN fails)
  double max_error() const;
};
ParityReport compare(const AttnResults& got, const AttnResults& ref, double tolerance);
// `got` against the fp64 reference_attention `ref` of the same problem and inputs, each row judged by error_bound
// (16-bit: relative to the error of dtype_reference_attention on those inputs, computed here).
ParityReport compare_to_reference(const AttnProblem& prob, const AttnInputs& in, const AttnResults& got,
                                  const AttnResults& ref);

}  // namespace ringtrain::check
