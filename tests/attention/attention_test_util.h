// Helpers for the attention tests: random BSHD problems and running a backend's forward/backward on them.
#pragma once

#include <random>

#include "ringtrain/attention/backend.h"
#include "test_util.h"

namespace ringtrain::testing {

struct AttnProblem {
  attention::AttnParams p;
  Tensor q, k, v, dout;
};

// Random q/k/v/dO of the given shape (BSHD, host), N(0,1) entries.
inline AttnProblem make_problem(int64_t b, int64_t hq, int64_t hkv, int64_t d, int64_t sq, int64_t skv,
                                attention::MaskType mask, DType dtype, std::mt19937_64& rng) {
  AttnProblem pr;
  pr.q = Tensor::empty({b, sq, hq, d}, dtype);
  pr.k = Tensor::empty({b, skv, hkv, d}, dtype);
  pr.v = Tensor::empty({b, skv, hkv, d}, dtype);
  pr.dout = Tensor::empty({b, sq, hq, d}, dtype);
  for (const Tensor* t : {&pr.q, &pr.k, &pr.v, &pr.dout}) fill_normal(*t, rng);
  pr.p = attention::params_for(pr.q, pr.k, mask);
  return pr;
}

struct AttnResult {
  Tensor o, lse, dq, dk, dv;
};

// Runs one backend directly (no selection): forward, then backward from its own O/LSE. Outputs are poisoned
// first; `out_dtype` is the dtype of O and the gradients.
inline AttnResult run_backend(const attention::Backend& be, const AttnProblem& pr, DType out_dtype) {
  const auto& p = pr.p;
  AttnResult r;
  r.o = Tensor::empty({p.batch, p.seqlen_q, p.heads_q, p.head_dim}, out_dtype);
  r.lse = Tensor::empty({p.batch, p.heads_q, p.seqlen_q}, DType::F32);
  r.dq = Tensor::empty({p.batch, p.seqlen_q, p.heads_q, p.head_dim}, out_dtype);
  r.dk = Tensor::empty({p.batch, p.seqlen_kv, p.heads_kv, p.head_dim}, out_dtype);
  r.dv = Tensor::empty({p.batch, p.seqlen_kv, p.heads_kv, p.head_dim}, out_dtype);
  for (const Tensor* t : {&r.o, &r.lse, &r.dq, &r.dk, &r.dv}) poison(*t);
  attention::AttnForwardArgs f{pr.q, pr.k, pr.v, r.o, r.lse};
  attention::validate(p, f);
  be.forward(p, f);
  attention::AttnBackwardArgs bw{pr.q, pr.k, pr.v, r.o, pr.dout, r.lse, r.dq, r.dk, r.dv};
  attention::validate(p, bw);
  be.backward(p, bw);
  return r;
}

}  // namespace ringtrain::testing
