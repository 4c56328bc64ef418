#include "ringtrain/check/attention_check.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <random>

#include "ringtrain/attention/cpu/cpu_backends.h"
#include "ringtrain/attention/selection.h"
#include "ringtrain/check/timing.h"
#include "ringtrain/comm/in_process.h"
#include "ringtrain/core/clock.h"
#include "ringtrain/core/device_info.h"
#include "ringtrain/core/error.h"
#include "ringtrain/cp/zigzag.h"

namespace ringtrain::check {

using attention::AttnParams;

std::string AttnProblem::describe() const {
  return cat(dtype_name(dtype), " B=", batch, " S=", seq, " Hq=", heads_q, " Hkv=", heads_kv, " D=", head_dim,
             causal ? " causal" : " non-causal", window > 0 ? cat(" window=", window) : std::string());
}

AttnParams AttnProblem::params(const TensorView& q, const TensorView& k) const {
  AttnParams p = attention::params_for(q, k, mask());
  p.window = window;
  return p;
}

double AttnProblem::forward_flops() const {
  const double per_pair = 4.0 * batch * heads_q * head_dim, s = static_cast<double>(seq);
  if (!causal) return per_pair * s * s;
  if (window > 0 && window < seq) return per_pair * (s * window - 0.5 * window * window);
  return per_pair * s * s / 2;
}

AttnBuffers::AttnBuffers(const AttnProblem& p, int64_t len, Device dev)
    : q(Tensor::empty({p.batch, len, p.heads_q, p.head_dim}, p.dtype, dev)),
      k(Tensor::empty({p.batch, len, p.heads_kv, p.head_dim}, p.dtype, dev)),
      v(Tensor::empty({p.batch, len, p.heads_kv, p.head_dim}, p.dtype, dev)),
      dout(Tensor::empty({p.batch, len, p.heads_q, p.head_dim}, p.dtype, dev)),
      o(Tensor::empty({p.batch, len, p.heads_q, p.head_dim}, p.dtype, dev)),
      lse(Tensor::empty({p.batch, p.heads_q, len}, DType::F32, dev)),
      dq(Tensor::empty({p.batch, len, p.heads_q, p.head_dim}, p.dtype, dev)),
      dk(Tensor::empty({p.batch, len, p.heads_kv, p.head_dim}, p.dtype, dev)),
      dv(Tensor::empty({p.batch, len, p.heads_kv, p.head_dim}, p.dtype, dev)) {}

attention::AttnForwardArgs AttnBuffers::forward_args() const {
  attention::AttnForwardArgs a;
  a.q = q, a.k = k, a.v = v, a.o = o, a.lse = lse;
  return a;
}

attention::AttnBackwardArgs AttnBuffers::backward_args() const {
  attention::AttnBackwardArgs a;
  a.q = q, a.k = k, a.v = v, a.o = o, a.dout = dout, a.lse = lse, a.dq = dq, a.dk = dk, a.dv = dv;
  return a;
}

void AttnBuffers::poison_outputs() const {
  for (const Tensor* t : {&o, &lse, &dq, &dk, &dv}) fill(*t, std::numeric_limits<double>::quiet_NaN());
}

void AttnBuffers::fill_inputs(uint64_t seed) const {
  uint64_t i = 0;
  for (const Tensor* t : {&q, &k, &v, &dout}) fill_normal_hashed(*t, seed * 8 + i++);
}

namespace {

// Host results of the problem's shape: o, dq, dk, dv of `dtype`, lse fp32, all NaN until written.
AttnResults host_results(const AttnProblem& p, DType dtype) {
  AttnProblem of_dtype = p;
  of_dtype.dtype = dtype;
  const AttnBuffers b(of_dtype, p.seq, Device::cpu());
  b.poison_outputs();
  return AttnResults{b.o, b.lse, b.dq, b.dk, b.dv};
}

// The CPU math backend accumulates in fp64 (else fp32) while this lives, then goes back to what it did before.
class MathFp64Scope {
 public:
  explicit MathFp64Scope(bool fp64) : saved_(attention::cpu::math_fp64()) { attention::cpu::set_math_fp64(fp64); }
  ~MathFp64Scope() { attention::cpu::set_math_fp64(saved_); }
  MathFp64Scope(const MathFp64Scope&) = delete;
  MathFp64Scope& operator=(const MathFp64Scope&) = delete;

 private:
  bool saved_;
};

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

// A contiguous fp32 host copy of a device view: the owning buffer and a view of the original's shape.
struct HostCopy {
  Tensor buffer;
  TensorView view;
};
HostCopy host_copy(const TensorView& t) {
  HostCopy h{Tensor::empty({t.numel()}, DType::F32), t};
  h.view.data = h.buffer.data();
  h.view.device = Device::cpu();
  h.view.dtype = DType::F32;
  int64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) h.view.stride[d] = stride, stride *= t.shape[d];
  copy(h.view, t);
  return h;
}

}  // namespace

AttnInputs random_inputs(const AttnProblem& p, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  const AttnBuffers b(p, p.seq, Device::cpu());
  AttnInputs in{b.q, b.k, b.v, b.dout};
  for (const Tensor* t : {&in.q, &in.k, &in.v, &in.dout})
    for (int64_t i = 0; i < t->numel(); ++i) store_from_double(t->data(), p.dtype, i, normal(rng));
  return in;
}

namespace {

// The CPU math backend on the unsharded sequence (called directly, not through selection), outputs in `out`: F64
// with fp64 accumulation, else fp32 accumulation and outputs rounded to `out`.
AttnResults math_attention(const AttnProblem& p, const AttnInputs& in, DType out) {
  const MathFp64Scope accumulation(out == DType::F64);
  const attention::Backend* math = attention::find_backend(attention::BackendId::Math, DeviceKind::CPU);
  RT_CHECK(math, "the CPU math backend is missing from the registry");
  const AttnParams params = p.params(in.q, in.k);
  AttnResults r = host_results(p, out);
  attention::AttnForwardArgs fa;
  fa.q = in.q, fa.k = in.k, fa.v = in.v, fa.o = r.o, fa.lse = r.lse;
  attention::validate(params, fa);
  auto t0 = SteadyClock::now();
  math->forward(params, fa);
  r.forward_seconds = seconds_since(t0);
  attention::AttnBackwardArgs ba;
  ba.q = in.q, ba.k = in.k, ba.v = in.v, ba.o = r.o, ba.dout = in.dout, ba.lse = r.lse;
  ba.dq = r.dq, ba.dk = r.dk, ba.dv = r.dv;
  attention::validate(params, ba);
  t0 = SteadyClock::now();
  math->backward(params, ba);
  r.backward_seconds = seconds_since(t0);
  return r;
}

}  // namespace

AttnResults reference_attention(const AttnProblem& p, const AttnInputs& in) { return math_attention(p, in, DType::F64); }

AttnResults dtype_reference_attention(const AttnProblem& p, const AttnInputs& in) {
  return math_attention(p, in, p.dtype);
}

double error_bound(DType dtype, double dtype_reference_error) {
  // fp32: accumulation-order differences only. 16-bit: the outputs carry the dtype's rounding, and a gradient that
  // is a cancellation (two keys of nearly equal weight) carries much more; the same computation in the dtype shows
  // how much, and a correct kernel stays within a few times that (PyTorch's attention tests use the same form).
  // The floor keeps a near-exact dtype reference from demanding more than the output rounding (2^-9 for bf16).
  if (dtype == DType::F32) return 1e-5;
  return 4.0 * dtype_reference_error + 2e-3;
}

AttnResults attention_on_device(const AttnProblem& p, const AttnInputs& in, Device dev) {
  const AttnBuffers b(p, p.seq, dev);
  copy(b.q, in.q);
  copy(b.k, in.k);
  copy(b.v, in.v);
  copy(b.dout, in.dout);
  b.poison_outputs();
  const AttnParams params = p.params(b.q, b.k);
  const attention::BackendScope cp_scope = attention::BackendScope::context_parallel(1);
  AttnResults r = host_results(p, p.dtype);
  synchronize(dev);
  auto t0 = SteadyClock::now();
  attention::forward(params, b.forward_args());
  synchronize(dev);
  r.forward_seconds = seconds_since(t0);
  t0 = SteadyClock::now();
  attention::backward(params, b.backward_args());
  synchronize(dev);
  r.backward_seconds = seconds_since(t0);
  copy(r.o, b.o);
  copy(r.lse, b.lse);
  copy(r.dq, b.dq);
  copy(r.dk, b.dk);
  copy(r.dv, b.dv);
  return r;
}

AttnResults cp_attention_on_ranks(const AttnProblem& p, const AttnInputs& in, const CpRunOptions& opt) {
  AttnResults out = host_results(p, p.dtype);
  comm::run_ranks(opt.cp, opt.timeout, [&](comm::Communicator& c) {
    const cp::ZigzagLayout l(opt.cp, c.rank(), p.seq);
    const AttnBuffers local(p, l.local_len(), Device::cpu());
    cp::shard(in.q, 1, l, local.q);
    cp::shard(in.k, 1, l, local.k);
    cp::shard(in.v, 1, l, local.v);
    cp::shard(in.dout, 1, l, local.dout);
    local.poison_outputs();

    const AttnParams params = p.params(local.q, local.k);
    std::optional<attention::BackendScope> model;
    if (!opt.model_scope.empty()) model.emplace("model", opt.model_scope);
    c.barrier();
    auto t0 = SteadyClock::now();
    cp::KeptKv kept;
    cp::attention_forward(c, opt.config, params, local.forward_args(), p.seq, opt.keep_kv ? &kept : nullptr);
    c.barrier();
    const double fwd = seconds_since(t0);
    t0 = SteadyClock::now();
    cp::attention_backward(c, opt.config, params, local.backward_args(), p.seq, opt.keep_kv ? &kept : nullptr);
    c.barrier();
    const double bwd = seconds_since(t0);
    if (c.rank() == 0) {
      out.forward_seconds = fwd;
      out.backward_seconds = bwd;
    }
    const int64_t valid = l.valid_len();
    check_padding(local.o, 1, valid, 0.0, "o", c.rank());
    check_padding(local.lse, 2, valid, -std::numeric_limits<double>::infinity(), "lse", c.rank());
    check_padding(local.dq, 1, valid, 0.0, "dq", c.rank());
    check_padding(local.dk, 1, valid, 0.0, "dk", c.rank());
    check_padding(local.dv, 1, valid, 0.0, "dv", c.rank());
    // Each rank writes only its own positions of the whole-sequence results.
    cp::unshard(local.o, 1, l, out.o);
    cp::unshard(local.lse, 2, l, out.lse);
    cp::unshard(local.dq, 1, l, out.dq);
    cp::unshard(local.dk, 1, l, out.dk);
    cp::unshard(local.dv, 1, l, out.dv);
  });
  return out;
}

std::pair<double, double> error_sums(const TensorView& got, const TensorView& ref) {
  RT_CHECK(got.ndim == ref.ndim, "relative_error: ", got.shape_str(), " vs ", ref.shape_str());
  for (int d = 0; d < got.ndim; ++d)
    RT_CHECK(got.shape[d] == ref.shape[d], "relative_error: ", got.shape_str(), " vs ", ref.shape_str());
  if (!got.device.is_cpu()) return error_sums(host_copy(got).view, ref);
  if (!ref.device.is_cpu()) return error_sums(got, host_copy(ref).view);
  double num = 0, den = 0;
  bool bad = false;
  for_each_offset(got, ref, [&](int64_t og, int64_t orf) {
    const double x = load_as_double(got.data, got.dtype, og), y = load_as_double(ref.data, ref.dtype, orf);
    if (std::isinf(y) && x == y) return;
    if (!std::isfinite(x) || !std::isfinite(y)) bad = true;
    num += (x - y) * (x - y);
    den += y * y;
  });
  if (bad) return {std::numeric_limits<double>::infinity(), den};
  return {num, den};
}

double relative_error(const TensorView& got, const TensorView& ref) {
  const auto [num, den] = error_sums(got, ref);
  if (std::isinf(num)) return num;
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

bool ParityReport::pass() const {
  return std::all_of(rows.begin(), rows.end(), [](const Row& r) { return r.error <= r.tolerance; });
}

double ParityReport::max_error() const {
  double m = 0;
  for (const Row& r : rows) m = std::isnan(r.error) ? r.error : std::max(m, r.error);
  return m;
}

ParityReport compare(const AttnResults& got, const AttnResults& ref, double tolerance) {
  ParityReport r;
  r.rows = {{"O", relative_error(got.o, ref.o), tolerance},
            {"LSE", relative_error(got.lse, ref.lse), tolerance},
            {"dQ", relative_error(got.dq, ref.dq), tolerance},
            {"dK", relative_error(got.dk, ref.dk), tolerance},
            {"dV", relative_error(got.dv, ref.dv), tolerance}};
  return r;
}

ParityReport compare_to_reference(const AttnProblem& prob, const AttnInputs& in, const AttnResults& got,
                                  const AttnResults& ref) {
  ParityReport r = compare(got, ref, error_bound(prob.dtype, 0.0));
  if (prob.dtype == DType::F32) return r;
  const ParityReport dtype_error = compare(dtype_reference_attention(prob, in), ref, 0.0);
  for (size_t i = 0; i < r.rows.size(); ++i) r.rows[i].tolerance = error_bound(prob.dtype, dtype_error.rows[i].error);
  return r;
}

}  // namespace ringtrain::check
