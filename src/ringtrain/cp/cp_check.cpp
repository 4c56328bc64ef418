#include "ringtrain/cp/cp_check.h"

#include <cmath>
#include <limits>
#include <optional>
#include <random>

#include "ringtrain/attention/cpu/cpu_backends.h"
#include "ringtrain/attention/selection.h"
#include "ringtrain/comm/in_process.h"
#include "ringtrain/core/error.h"
#include "ringtrain/cp/zigzag.h"

namespace ringtrain::cp {

using attention::AttnBackwardArgs;
using attention::AttnForwardArgs;
using attention::AttnParams;
using attention::MaskType;
using Clock = std::chrono::steady_clock;

std::string AttnProblem::describe() const {
  return cat(dtype_name(dtype), " B=", batch, " S=", seq, " Hq=", heads_q, " Hkv=", heads_kv, " D=", head_dim,
             causal ? " causal" : " non-causal");
}

namespace {

Tensor bshd(const AttnProblem& p, int64_t len, int64_t heads, DType dtype) {
  return Tensor::empty({p.batch, len, heads, p.head_dim}, dtype);
}
Tensor lse_tensor(const AttnProblem& p, int64_t len) { return Tensor::empty({p.batch, p.heads_q, len}, DType::F32); }

void poison(const TensorView& t) { fill(t, std::numeric_limits<double>::quiet_NaN()); }

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Throws unless every element of rows [from, end) along dim is `want` (padding rows of a rank's outputs).
void check_padding(const TensorView& t, int dim, int64_t from, double want, const char* name, int rank) {
  if (from >= t.shape[dim]) return;
  const TensorView pad = t.slice(dim, from, t.shape[dim] - from);
  for_each_offset(pad, pad, [&](int64_t off, int64_t) {
    const double v = load_as_double(pad.data, pad.dtype, off);
    RT_CHECK(v == want, "rank ", rank, ": padding of '", name, "' ", t.shape_str(), " (positions >= ", from,
             ") holds ", v, ", expected ", want);
  });
}

}  // namespace

AttnInputs random_inputs(const AttnProblem& p, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  AttnInputs in{bshd(p, p.seq, p.heads_q, p.dtype), bshd(p, p.seq, p.heads_kv, p.dtype),
                bshd(p, p.seq, p.heads_kv, p.dtype), bshd(p, p.seq, p.heads_q, p.dtype)};
  for (const Tensor* t : {&in.q, &in.k, &in.v, &in.dout})
    for (int64_t i = 0; i < t->numel(); ++i) store_from_double(t->data(), p.dtype, i, normal(rng));
  return in;
}

namespace {

// The CPU math backend on the unsharded sequence, outputs in `out` (F64 with fp64 accumulation, else fp32
// accumulation and outputs rounded to `out`).
AttnResults math_attention(const AttnProblem& p, const AttnInputs& in, DType out) {
  attention::cpu::set_math_fp64(out == DType::F64);  // process-wide switch
  const attention::Backend* math = attention::find_backend(attention::BackendId::Math, DeviceKind::CPU);
  RT_CHECK(math, "the CPU math backend is missing from the registry");
  const AttnParams params = attention::params_for(in.q, in.k, p.causal ? MaskType::CausalTopLeft : MaskType::None);
  AttnResults r{bshd(p, p.seq, p.heads_q, out), lse_tensor(p, p.seq), bshd(p, p.seq, p.heads_q, out),
                bshd(p, p.seq, p.heads_kv, out), bshd(p, p.seq, p.heads_kv, out)};
  for (const Tensor* t : {&r.o, &r.lse, &r.dq, &r.dk, &r.dv}) poison(*t);
  AttnForwardArgs fa;
  fa.q = in.q;
  fa.k = in.k;
  fa.v = in.v;
  fa.o = r.o;
  fa.lse = r.lse;
  attention::validate(params, fa);
  auto t0 = Clock::now();
  math->forward(params, fa);
  r.forward_seconds = seconds_since(t0);
  AttnBackwardArgs ba;
  ba.q = in.q;
  ba.k = in.k;
  ba.v = in.v;
  ba.o = r.o;
  ba.dout = in.dout;
  ba.lse = r.lse;
  ba.dq = r.dq;
  ba.dk = r.dk;
  ba.dv = r.dv;
  attention::validate(params, ba);
  t0 = Clock::now();
  math->backward(params, ba);
  r.backward_seconds = seconds_since(t0);
  return r;
}

}  // namespace

AttnResults reference_attention(const AttnProblem& p, const AttnInputs& in) { return math_attention(p, in, DType::F64); }

AttnResults dtype_reference_attention(const AttnProblem& p, const AttnInputs& in) {
  AttnResults r = math_attention(p, in, p.dtype);
  attention::cpu::set_math_fp64(true);  // the state reference_attention leaves, which the CP tests expect
  return r;
}

double error_bound(DType dtype, double dtype_reference_error) {
  // fp32: accumulation-order differences only. 16-bit: the outputs carry the dtype's rounding, and a gradient that
  // is a cancellation (two keys of nearly equal weight) carries much more; the same computation in the dtype shows
  // how much, and a correct kernel stays within a few times that (PyTorch's attention tests use the same form).
  // The floor keeps a near-exact dtype reference from demanding more than the output rounding (2^-9 for bf16).
  if (dtype == DType::F32) return 1e-5;
  return 4.0 * dtype_reference_error + 2e-3;
}

AttnResults cp_attention_on_ranks(const AttnProblem& p, const AttnInputs& in, const CpRunOptions& opt) {
  AttnResults out{bshd(p, p.seq, p.heads_q, p.dtype), lse_tensor(p, p.seq), bshd(p, p.seq, p.heads_q, p.dtype),
                  bshd(p, p.seq, p.heads_kv, p.dtype), bshd(p, p.seq, p.heads_kv, p.dtype)};
  for (const Tensor* t : {&out.o, &out.lse, &out.dq, &out.dk, &out.dv}) poison(*t);
  comm::run_ranks(opt.cp, opt.timeout, [&](comm::Communicator& c) {
    const ZigzagLayout l(opt.cp, c.rank(), p.seq);
    const int64_t len = l.local_len();
    Tensor q = bshd(p, len, p.heads_q, p.dtype), k = bshd(p, len, p.heads_kv, p.dtype);
    Tensor v = bshd(p, len, p.heads_kv, p.dtype), dout = bshd(p, len, p.heads_q, p.dtype);
    shard(in.q, 1, l, q);
    shard(in.k, 1, l, k);
    shard(in.v, 1, l, v);
    shard(in.dout, 1, l, dout);
    Tensor o = bshd(p, len, p.heads_q, p.dtype), lse = lse_tensor(p, len);
    Tensor dq = bshd(p, len, p.heads_q, p.dtype), dk = bshd(p, len, p.heads_kv, p.dtype);
    Tensor dv = bshd(p, len, p.heads_kv, p.dtype);
    for (const Tensor* t : {&o, &lse, &dq, &dk, &dv}) poison(*t);

    const AttnParams params = attention::params_for(q, k, p.causal ? MaskType::CausalTopLeft : MaskType::None);
    std::optional<attention::BackendScope> model;
    if (!opt.model_scope.empty()) model.emplace("model", opt.model_scope);
    AttnForwardArgs fa;
    fa.q = q;
    fa.k = k;
    fa.v = v;
    fa.o = o;
    fa.lse = lse;
    AttnBackwardArgs ba;
    ba.q = q;
    ba.k = k;
    ba.v = v;
    ba.o = o;
    ba.dout = dout;
    ba.lse = lse;
    ba.dq = dq;
    ba.dk = dk;
    ba.dv = dv;
    c.barrier();
    auto t0 = Clock::now();
    KeptKv kept;
    attention_forward(c, opt.config, params, fa, p.seq, opt.keep_kv ? &kept : nullptr);
    c.barrier();
    const double fwd = seconds_since(t0);
    t0 = Clock::now();
    attention_backward(c, opt.config, params, ba, p.seq, opt.keep_kv ? &kept : nullptr);
    c.barrier();
    const double bwd = seconds_since(t0);
    if (c.rank() == 0) {
      out.forward_seconds = fwd;
      out.backward_seconds = bwd;
    }
    const int64_t valid = l.valid_len();
    check_padding(o, 1, valid, 0.0, "o", c.rank());
    check_padding(lse, 2, valid, -std::numeric_limits<double>::infinity(), "lse", c.rank());
    check_padding(dq, 1, valid, 0.0, "dq", c.rank());
    check_padding(dk, 1, valid, 0.0, "dk", c.rank());
    check_padding(dv, 1, valid, 0.0, "dv", c.rank());
    // Each rank writes only its own positions of the whole-sequence results.
    unshard(o, 1, l, out.o);
    unshard(lse, 2, l, out.lse);
    unshard(dq, 1, l, out.dq);
    unshard(dk, 1, l, out.dk);
    unshard(dv, 1, l, out.dv);
  });
  return out;
}

double relative_error(const TensorView& got, const TensorView& ref) {
  RT_CHECK(got.ndim == ref.ndim, "relative_error: ", got.shape_str(), " vs ", ref.shape_str());
  for (int d = 0; d < got.ndim; ++d)
    RT_CHECK(got.shape[d] == ref.shape[d], "relative_error: ", got.shape_str(), " vs ", ref.shape_str());
  double num = 0, den = 0;
  bool bad = false;
  for_each_offset(got, ref, [&](int64_t og, int64_t orf) {
    const double x = load_as_double(got.data, got.dtype, og), y = load_as_double(ref.data, ref.dtype, orf);
    if (std::isinf(y) && x == y) return;
    if (!std::isfinite(x) || !std::isfinite(y)) bad = true;
    num += (x - y) * (x - y);
    den += y * y;
  });
  if (bad) return std::numeric_limits<double>::infinity();
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace ringtrain::cp
