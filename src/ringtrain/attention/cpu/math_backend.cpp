// CPU `math` backend: the reference. Materialises each query row's scores over its visible keys (causal limit and
// sliding window) plus the additive bias, if any, exact softmax, and the textbook backward from the given (final) O
// and LSE. Accumulates in fp64 by default (set_math_fp64).
#include <atomic>
#include <cmath>
#include <limits>

#include "ringtrain/attention/cpu/cpu_backends.h"
#include "ringtrain/attention/cpu/head_io.h"
#include "ringtrain/core/error.h"
#include "ringtrain/core/parallel.h"

namespace ringtrain::attention::cpu {
namespace {

std::atomic<bool> g_fp64{true};

// Work item: one sequence and one kv head with its group of query heads (dK/dV of a kv head are owned by one
// item, so items run in parallel without sharing outputs).
struct Item {
  Segment seg;
  int64_t kv_head;
};

// bias(b, h, i, .) as a row pointer-like accessor; all zeros when the call has no bias.
struct BiasRow {
  const TensorView* bias = nullptr;  // broadcast view (bias_broadcast_view)
  int64_t base = 0;
  double operator()(int64_t j) const {
    return bias ? load_as_double(bias->data, bias->dtype, base + j * bias->stride[3]) : 0.0;
  }
};

BiasRow bias_row(const TensorView* bias, int64_t b, int64_t h, int64_t i) {
  if (!bias) return {};
  return {bias, b * bias->stride[0] + h * bias->stride[1] + i * bias->stride[2]};
}

std::vector<Item> items(const AttnParams& p, const std::vector<Segment>& segs) {
  std::vector<Item> out;
  for (const Segment& s : segs)
    for (int64_t h = 0; h < p.heads_kv; ++h) out.push_back({s, h});
  return out;
}

template <typename Acc>
void forward_item(const AttnParams& p, const AttnForwardArgs& a, const Item& it) {
  const Segment& s = it.seg;
  const int64_t d = p.head_dim, group = p.heads_q / p.heads_kv;
  const Acc scale = static_cast<Acc>(p.scale());
  const TensorView qr = rows_view(p, a.q, s.batch), kr = rows_view(p, a.k, s.batch), vr = rows_view(p, a.v, s.batch);
  const TensorView orow = rows_view(p, a.o, s.batch), lse = lse_view(p, a.lse, s.batch);
  const TensorView bias = p.has_bias ? bias_broadcast_view(a.bias) : TensorView{};
  std::vector<Acc> q, k, v, o(static_cast<size_t>(s.sq * d)), sc(static_cast<size_t>(s.skv));
  load_head(kr, s.k_start, s.skv, it.kv_head, k);
  load_head(vr, s.k_start, s.skv, it.kv_head, v);
  for (int64_t h = it.kv_head * group; h < (it.kv_head + 1) * group; ++h) {
    load_head(qr, s.q_start, s.sq, h, q);
    for (int64_t i = 0; i < s.sq; ++i) {
      const int64_t lim = key_limit(p.mask, i, s.sq, s.skv), first = key_start(p.mask, p.window, i, s.sq, s.skv);
      Acc* oi = &o[i * d];
      for (int64_t c = 0; c < d; ++c) oi[c] = 0;
      float* lse_i = static_cast<float*>(lse.data) + h * lse.stride[0] + (s.q_start + i) * lse.stride[1];
      if (first >= lim) {
        *lse_i = -std::numeric_limits<float>::infinity();
        continue;
      }
      const BiasRow bias_i = bias_row(p.has_bias ? &bias : nullptr, s.batch, h, i);
      Acc m = -std::numeric_limits<Acc>::infinity();
      for (int64_t j = first; j < lim; ++j) {
        Acc dot = 0;
        for (int64_t c = 0; c < d; ++c) dot += q[i * d + c] * k[j * d + c];
        sc[j] = dot * scale + static_cast<Acc>(bias_i(j));
        m = std::max(m, sc[j]);
      }
      if (m == -std::numeric_limits<Acc>::infinity()) {  // the bias hid every visible key
        *lse_i = -std::numeric_limits<float>::infinity();
        continue;
      }
      Acc l = 0;
      for (int64_t j = first; j < lim; ++j) {
        const Acc pj = std::exp(sc[j] - m);
        l += pj;
        for (int64_t c = 0; c < d; ++c) oi[c] += pj * v[j * d + c];
      }
      for (int64_t c = 0; c < d; ++c) oi[c] /= l;
      *lse_i = static_cast<float>(m + std::log(l));
    }
    store_head(orow, s.q_start, s.sq, h, o, false);
  }
}

template <typename Acc>
void backward_item(const AttnParams& p, const AttnBackwardArgs& a, const Item& it) {
  const Segment& s = it.seg;
  const int64_t d = p.head_dim, group = p.heads_q / p.heads_kv;
  const Acc scale = static_cast<Acc>(p.scale());
  const TensorView qr = rows_view(p, a.q, s.batch), kr = rows_view(p, a.k, s.batch), vr = rows_view(p, a.v, s.batch);
  const TensorView orow = rows_view(p, a.o, s.batch), dor = rows_view(p, a.dout, s.batch);
  const TensorView lse = lse_view(p, a.lse, s.batch);
  const TensorView bias = p.has_bias ? bias_broadcast_view(a.bias) : TensorView{};
  std::vector<Acc> q, k, v, o, dout, dq(static_cast<size_t>(s.sq * d));
  std::vector<Acc> dk(static_cast<size_t>(s.skv * d), 0), dv(static_cast<size_t>(s.skv * d), 0);
  std::vector<Acc> pr(static_cast<size_t>(s.skv));
  load_head(kr, s.k_start, s.skv, it.kv_head, k);
  load_head(vr, s.k_start, s.skv, it.kv_head, v);
  for (int64_t h = it.kv_head * group; h < (it.kv_head + 1) * group; ++h) {
    load_head(qr, s.q_start, s.sq, h, q);
    load_head(orow, s.q_start, s.sq, h, o);
    load_head(dor, s.q_start, s.sq, h, dout);
    for (int64_t i = 0; i < s.sq; ++i) {
      Acc* dqi = &dq[i * d];
      for (int64_t c = 0; c < d; ++c) dqi[c] = 0;
      const float lse_i = static_cast<const float*>(lse.data)[h * lse.stride[0] + (s.q_start + i) * lse.stride[1]];
      const int64_t lim = key_limit(p.mask, i, s.sq, s.skv), first = key_start(p.mask, p.window, i, s.sq, s.skv);
      if (first >= lim || std::isinf(lse_i)) continue;  // a row that saw no key has no gradient
      const BiasRow bias_i = bias_row(p.has_bias ? &bias : nullptr, s.batch, h, i);
      Acc di = 0;
      for (int64_t c = 0; c < d; ++c) di += dout[i * d + c] * o[i * d + c];
      for (int64_t j = first; j < lim; ++j) {
        Acc dot = 0, dp = 0;
        for (int64_t c = 0; c < d; ++c) {
          dot += q[i * d + c] * k[j * d + c];
          dp += dout[i * d + c] * v[j * d + c];
        }
        const Acc pij = std::exp(dot * scale + static_cast<Acc>(bias_i(j)) - static_cast<Acc>(lse_i));
        const Acc ds = pij * (dp - di) * scale;
        for (int64_t c = 0; c < d; ++c) {
          dv[j * d + c] += pij * dout[i * d + c];
          dqi[c] += ds * k[j * d + c];
          dk[j * d + c] += ds * q[i * d + c];
        }
      }
    }
    store_head(rows_view(p, a.dq, s.batch), s.q_start, s.sq, h, dq, a.accumulate);
  }
  store_head(rows_view(p, a.dk, s.batch), s.k_start, s.skv, it.kv_head, dk, a.accumulate);
  store_head(rows_view(p, a.dv, s.batch), s.k_start, s.skv, it.kv_head, dv, a.accumulate);
}

class MathBackend final : public Backend {
 public:
  BackendId id() const override { return BackendId::Math; }
  DeviceKind device_kind() const override { return DeviceKind::CPU; }
  bool cp_capable() const override { return true; }  // tests/cp: ring and all-gather parity on CPU ranks

  std::vector<std::string> unsupported_reasons(const AttnParams& p) const override {
    std::vector<std::string> r;
    if (p.kv_cache) r.push_back(kv_cache_reason());
    if (!is_float(p.dtype)) r.push_back(cat("dtype ", dtype_name(p.dtype), " is not a float type"));
    return r;
  }

  void forward(const AttnParams& p, const AttnForwardArgs& a) const override {
    const auto work = items(p, segments(p, a.cu_seqlens_q, a.cu_seqlens_kv));
    parallel_for(static_cast<int64_t>(work.size()), [&](int64_t i) {
      if (g_fp64) forward_item<double>(p, a, work[i]);
      else forward_item<float>(p, a, work[i]);
    });
  }

  void backward(const AttnParams& p, const AttnBackwardArgs& a) const override {
    const auto work = items(p, segments(p, a.cu_seqlens_q, a.cu_seqlens_kv));
    parallel_for(static_cast<int64_t>(work.size()), [&](int64_t i) {
      if (g_fp64) backward_item<double>(p, a, work[i]);
      else backward_item<float>(p, a, work[i]);
    });
  }
};

}  // namespace

std::unique_ptr<Backend> make_math_backend() { return std::make_unique<MathBackend>(); }
void set_math_fp64(bool fp64) { g_fp64 = fp64; }
bool math_fp64() { return g_fp64; }

}  // namespace ringtrain::attention::cpu
