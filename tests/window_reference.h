// Hugging Face's sliding-window rule, written out independently of attention::key_start, the window as a dense
// additive bias, and attention under that bias: the reference of the window tests (tests/attention,
// tests/attention_gpu, the CP tests).
#pragma once

#include <cstdint>
#include <limits>

#include "ringtrain/attention/backend.h"
#include "ringtrain/attention/cpu/cpu_backends.h"
#include "ringtrain/attention/params.h"
#include "ringtrain/core/tensor.h"
#include "test_util.h"

namespace ringtrain::testing {

// Hugging Face's rule (masking_utils: causal and sliding_window_overlay): key j is visible to query row i, at
// position pos = i (top-left) or i + Skv - Sq (bottom-right), when j <= pos and pos - j < w.
inline bool hf_visible(attention::MaskType m, int64_t w, int64_t i, int64_t j, int64_t sq, int64_t skv) {
  const int64_t pos = m == attention::MaskType::CausalBottomRight ? i + skv - sq : i;
  return j <= pos && (w == 0 || pos - j < w);
}

// The window as a bias [1, 1, Sq, Skv] fp64: 0 where the rule shows the key, -inf elsewhere.
inline Tensor window_bias(attention::MaskType m, int64_t w, int64_t sq, int64_t skv) {
  Tensor b = Tensor::empty({1, 1, sq, skv}, DType::F64);
  for (int64_t i = 0; i < sq; ++i)
    for (int64_t j = 0; j < skv; ++j)
      b.ptr<double>()[i * skv + j] = hf_visible(m, w, i, j, sq, skv) ? 0.0 : -std::numeric_limits<double>::infinity();
  return b;
}

// The CPU math backend, accumulating in fp64, on the call `p` describes (its mask; its window as a dense -inf bias
// instead of the window): O, dQ, dK, dV in fp64 and LSE in fp32, each poisoned first.
struct WindowReference {
  Tensor o, lse, dq, dk, dv;
};
inline WindowReference window_bias_reference(const attention::AttnParams& p, const TensorView& q, const TensorView& k,
                                             const TensorView& v, const TensorView& dout) {
  struct Fp64Accumulation {
    bool saved = attention::cpu::math_fp64();
    Fp64Accumulation() { attention::cpu::set_math_fp64(true); }
    ~Fp64Accumulation() { attention::cpu::set_math_fp64(saved); }
  } fp64;
  attention::AttnParams biased = p;
  biased.window = 0;
  biased.has_bias = true;
  const Tensor bias = window_bias(p.mask, p.window, p.seqlen_q, p.seqlen_kv);
  WindowReference r;
  r.o = Tensor::empty({p.batch, p.seqlen_q, p.heads_q, p.head_dim}, DType::F64);
  r.lse = Tensor::empty({p.batch, p.heads_q, p.seqlen_q}, DType::F32);
  r.dq = Tensor::empty({p.batch, p.seqlen_q, p.heads_q, p.head_dim}, DType::F64);
  r.dk = Tensor::empty({p.batch, p.seqlen_kv, p.heads_kv, p.head_dim}, DType::F64);
  r.dv = Tensor::empty({p.batch, p.seqlen_kv, p.heads_kv, p.head_dim}, DType::F64);
  for (const Tensor* t : {&r.o, &r.lse, &r.dq, &r.dk, &r.dv}) poison(*t);
  const attention::Backend& math = *attention::find_backend(attention::BackendId::Math, DeviceKind::CPU);
  attention::AttnForwardArgs f{q, k, v, r.o, r.lse};
  f.bias = bias;
  attention::validate(biased, f);
  math.forward(biased, f);
  attention::AttnBackwardArgs b{q, k, v, r.o, dout, r.lse, r.dq, r.dk, r.dv};
  b.bias = bias;
  attention::validate(biased, b);
  math.backward(biased, b);
  return r;
}

}  // namespace ringtrain::testing
