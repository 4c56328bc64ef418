#include "ringtrain/model/decoder_layer.h"

#include <type_traits>

#include "ringtrain/model/layers.h"

namespace ringtrain::model {
namespace {

template <typename T>
constexpr DType dtype_of() {
  return std::is_same_v<T, double> ? DType::F64 : DType::F32;
}

template <typename T>
TensorView bshd(const std::vector<T>& v, int64_t b, int64_t s, int64_t h, int64_t d) {
  return contiguous_view(const_cast<T*>(v.data()), dtype_of<T>(), Device::cpu(), {b, s, h, d});
}

template <typename T>
void zeros(std::vector<T>& v, int64_t n) {
  v.assign(static_cast<size_t>(n), T(0));
}

template <typename T>
void drop(std::vector<T>& v) {
  std::vector<T>().swap(v);
}

}  // namespace

template <typename T>
void LayerActs<T>::release_all_but_input() {
  drop(norm1), drop(rstd1), drop(q_raw), drop(k_raw), drop(rstd_q), drop(rstd_k), drop(q), drop(k), drop(v);
  drop(attn), drop(lse), drop(mid), drop(norm2), drop(rstd2), drop(gate), drop(up), drop(act);
}

template <typename T>
void decoder_layer_forward(const LayerCall& call, const T* p, LayerActs<T>& a, T* x_out) {
  const ModelConfig& c = *call.config;
  const LayerOffsets& w = *call.offsets;
  const int64_t B = call.batch, S = call.seqlen, N = B * S, H = c.hidden, D = c.head_dim;
  const int64_t qd = c.heads * D, kvd = c.kv_heads * D, F = c.ffn;

  a.norm1.resize(N * H), a.rstd1.resize(N);
  rmsnorm_forward(a.norm1.data(), a.rstd1.data(), a.x_in.data(), p + w.input_norm, N, H, c.rms_eps);
  a.q.resize(N * qd), a.k.resize(N * kvd), a.v.resize(N * kvd);
  linear_forward(a.q.data(), a.norm1.data(), p + w.q_w, param_at(p, w.q_b), N, H, qd);
  linear_forward(a.k.data(), a.norm1.data(), p + w.k_w, param_at(p, w.k_b), N, H, kvd);
  linear_forward(a.v.data(), a.norm1.data(), p + w.v_w, param_at(p, w.v_b), N, H, kvd);
  if (c.qk_norm) {
    a.q_raw = a.q, a.k_raw = a.k;
    a.rstd_q.resize(N * c.heads), a.rstd_k.resize(N * c.kv_heads);
    rmsnorm_forward(a.q.data(), a.rstd_q.data(), a.q_raw.data(), p + w.q_norm, N * c.heads, D, c.rms_eps);
    rmsnorm_forward(a.k.data(), a.rstd_k.data(), a.k_raw.data(), p + w.k_norm, N * c.kv_heads, D, c.rms_eps);
  }
  rope_forward(a.q.data(), call.positions, *call.inv_freq, N, c.heads, D);
  rope_forward(a.k.data(), call.positions, *call.inv_freq, N, c.kv_heads, D);

  a.attn.resize(N * qd), a.lse.resize(B * c.heads * S);
  call.attention->forward(bshd(a.q, B, S, c.heads, D), bshd(a.k, B, S, c.kv_heads, D), bshd(a.v, B, S, c.kv_heads, D),
                          bshd(a.attn, B, S, c.heads, D),
                          contiguous_view(a.lse.data(), DType::F32, Device::cpu(), {B, c.heads, S}), call.window);

  a.mid.resize(N * H);
  linear_forward(a.mid.data(), a.attn.data(), p + w.o_w, param_at(p, w.o_b), N, qd, H);
  for (int64_t i = 0; i < N * H; ++i) a.mid[i] += a.x_in[i];

  a.norm2.resize(N * H), a.rstd2.resize(N);
  rmsnorm_forward(a.norm2.data(), a.rstd2.data(), a.mid.data(), p + w.post_norm, N, H, c.rms_eps);
  a.gate.resize(N * F), a.up.resize(N * F), a.act.resize(N * F);
  linear_forward(a.gate.data(), a.norm2.data(), p + w.gate, static_cast<const T*>(nullptr), N, H, F);
  linear_forward(a.up.data(), a.norm2.data(), p + w.up, static_cast<const T*>(nullptr), N, H, F);
  swiglu_forward(a.act.data(), a.gate.data(), a.up.data(), N * F);
  linear_forward(x_out, a.act.data(), p + w.down, static_cast<const T*>(nullptr), N, F, H);
  for (int64_t i = 0; i < N * H; ++i) x_out[i] += a.mid[i];
}

template <typename T>
void decoder_layer_backward(const LayerCall& call, const T* p, T* g, const LayerActs<T>& a, T* dx) {
  const ModelConfig& c = *call.config;
  const LayerOffsets& w = *call.offsets;
  const int64_t B = call.batch, S = call.seqlen, N = B * S, H = c.hidden, D = c.head_dim;
  const int64_t qd = c.heads * D, kvd = c.kv_heads * D, F = c.ffn;

  // MLP branch; dx doubles as d(mid) through the residual.
  std::vector<T> d_act, d_gate(N * F), d_up(N * F), d_norm;
  zeros(d_act, N * F);
  linear_backward(d_act.data(), g + w.down, static_cast<T*>(nullptr), dx, a.act.data(), p + w.down, N, F, H);
  swiglu_backward(d_gate.data(), d_up.data(), d_act.data(), a.gate.data(), a.up.data(), N * F);
  zeros(d_norm, N * H);
  linear_backward(d_norm.data(), g + w.gate, static_cast<T*>(nullptr), d_gate.data(), a.norm2.data(), p + w.gate, N,
                  H, F);
  linear_backward(d_norm.data(), g + w.up, static_cast<T*>(nullptr), d_up.data(), a.norm2.data(), p + w.up, N, H, F);
  rmsnorm_backward(dx, g + w.post_norm, d_norm.data(), a.mid.data(), p + w.post_norm, a.rstd2.data(), N, H);

  // Attention branch; dx is now d(mid) and becomes d(x_in).
  std::vector<T> d_attn, dq(N * qd), dk(N * kvd), dv(N * kvd);
  zeros(d_attn, N * qd);
  linear_backward(d_attn.data(), g + w.o_w, param_at(g, w.o_b), dx, a.attn.data(), p + w.o_w, N, qd, H);
  call.attention->backward(bshd(a.q, B, S, c.heads, D), bshd(a.k, B, S, c.kv_heads, D),
                           bshd(a.v, B, S, c.kv_heads, D), bshd(a.attn, B, S, c.heads, D),
                           bshd(d_attn, B, S, c.heads, D),
                           contiguous_view(const_cast<float*>(a.lse.data()), DType::F32, Device::cpu(), {B, c.heads, S}),
                           bshd(dq, B, S, c.heads, D), bshd(dk, B, S, c.kv_heads, D), bshd(dv, B, S, c.kv_heads, D),
                           call.window);
  rope_backward(dq.data(), call.positions, *call.inv_freq, N, c.heads, D);
  rope_backward(dk.data(), call.positions, *call.inv_freq, N, c.kv_heads, D);
  if (c.qk_norm) {
    std::vector<T> dq_raw, dk_raw;
    zeros(dq_raw, N * qd), zeros(dk_raw, N * kvd);
    rmsnorm_backward(dq_raw.data(), g + w.q_norm, dq.data(), a.q_raw.data(), p + w.q_norm, a.rstd_q.data(),
                     N * c.heads, D);
    rmsnorm_backward(dk_raw.data(), g + w.k_norm, dk.data(), a.k_raw.data(), p + w.k_norm, a.rstd_k.data(),
                     N * c.kv_heads, D);
    dq.swap(dq_raw), dk.swap(dk_raw);
  }
  zeros(d_norm, N * H);
  linear_backward(d_norm.data(), g + w.q_w, param_at(g, w.q_b), dq.data(), a.norm1.data(), p + w.q_w, N, H, qd);
  linear_backward(d_norm.data(), g + w.k_w, param_at(g, w.k_b), dk.data(), a.norm1.data(), p + w.k_w, N, H, kvd);
  linear_backward(d_norm.data(), g + w.v_w, param_at(g, w.v_b), dv.data(), a.norm1.data(), p + w.v_w, N, H, kvd);
  rmsnorm_backward(dx, g + w.input_norm, d_norm.data(), a.x_in.data(), p + w.input_norm, a.rstd1.data(), N, H);
}

template struct LayerActs<float>;
template struct LayerActs<double>;
template void decoder_layer_forward<float>(const LayerCall&, const float*, LayerActs<float>&, float*);
template void decoder_layer_forward<double>(const LayerCall&, const double*, LayerActs<double>&, double*);
template void decoder_layer_backward<float>(const LayerCall&, const float*, float*, const LayerActs<float>&, float*);
template void decoder_layer_backward<double>(const LayerCall&, const double*, double*, const LayerActs<double>&,
                                             double*);

}  // namespace ringtrain::model
