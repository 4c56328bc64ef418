#include "ringtrain/train/optimizer.h"

#include <cmath>

#include "ringtrain/core/error.h"

namespace ringtrain::train {

void validate(const AdamWConfig& cfg) {
  RT_CHECK(cfg.beta1 >= 0 && cfg.beta1 < 1, "AdamW: beta1 ", cfg.beta1, " must be in [0, 1)");
  RT_CHECK(cfg.beta2 >= 0 && cfg.beta2 < 1, "AdamW: beta2 ", cfg.beta2, " must be in [0, 1)");
  RT_CHECK(std::isfinite(cfg.eps) && cfg.eps > 0, "AdamW: eps ", cfg.eps, " must be > 0");
  RT_CHECK(std::isfinite(cfg.weight_decay) && cfg.weight_decay >= 0, "AdamW: weight_decay ", cfg.weight_decay,
           " must be >= 0");
  RT_CHECK(!std::isnan(cfg.max_grad_norm), "AdamW: max_grad_norm is NaN");
}

AdamWStep plan_adamw_step(const AdamWConfig& cfg, int64_t completed_steps, double lr, double global_grad_sq_norm) {
  validate(cfg);
  RT_CHECK(std::isfinite(lr) && lr >= 0, "AdamW: learning rate ", lr, " must be finite and >= 0");
  RT_CHECK(completed_steps >= 0, "AdamW: completed steps ", completed_steps, " < 0");
  RT_CHECK(!(global_grad_sq_norm < 0), "AdamW: the gradients' sum of squares ", global_grad_sq_norm, " is negative");
  AdamWStep s;
  s.grad_norm = std::sqrt(global_grad_sq_norm);
  s.lr = lr;
  if (!std::isfinite(s.grad_norm)) {
    s.skipped = true;
    s.step = completed_steps;
    return s;
  }
  if (cfg.max_grad_norm > 0) {
    const double coef = cfg.max_grad_norm / (s.grad_norm + 1e-6);
    if (coef < 1) s.clip_coef = coef;
  }
  s.step = completed_steps + 1;
  s.beta1 = cfg.beta1;
  s.beta2 = cfg.beta2;
  s.eps = cfg.eps;
  s.decay_factor = 1.0 - lr * cfg.weight_decay;
  const double t = static_cast<double>(s.step);
  s.step_size = lr / (1.0 - std::pow(cfg.beta1, t));
  s.bias_correction2_sqrt = std::sqrt(1.0 - std::pow(cfg.beta2, t));
  return s;
}

template <typename M>
AdamWScalars<M> adamw_scalars(const AdamWStep& s) {
  return {static_cast<M>(s.clip_coef),   static_cast<M>(s.beta1),        static_cast<M>(s.beta2),
          static_cast<M>(1.0 - s.beta1), static_cast<M>(1.0 - s.beta2),  static_cast<M>(s.decay_factor),
          static_cast<M>(s.step_size),   static_cast<M>(s.bias_correction2_sqrt), static_cast<M>(s.eps)};
}

template <typename M>
double sum_of_squares(std::span<const M> grad) {
  double sum = 0;
  for (M g : grad) sum += static_cast<double>(g) * static_cast<double>(g);
  return sum;
}

namespace {

template <typename M>
void store_compute(ComputeWeights out, int64_t i, M p) {
  switch (out.dtype) {
    case DType::F32: static_cast<float*>(out.data)[i] = static_cast<float>(p); break;
    case DType::F64: static_cast<double*>(out.data)[i] = static_cast<double>(p); break;
    case DType::BF16: static_cast<uint16_t*>(out.data)[i] = float_to_bf16(static_cast<float>(p)); break;
    default: break;  // rejected before the loop
  }
}

}  // namespace

template <typename M>
void adamw_update(const AdamWStep& s, M* master, M* exp_avg, M* exp_avg_sq, const M* grad, int64_t n,
                  ComputeWeights out) {
  RT_CHECK(out.data == nullptr || out.dtype == DType::F32 || out.dtype == DType::F64 || out.dtype == DType::BF16,
           "AdamW: compute weights must be fp32, fp64 or bf16, not ", dtype_name(out.dtype));
  if (s.skipped) return;
  const AdamWScalars<M> c = adamw_scalars<M>(s);
  for (int64_t i = 0; i < n; ++i) {
    const M g = grad[i] * c.clip;
    const M m = c.beta1 * exp_avg[i] + c.one_minus_beta1 * g;
    const M v = c.beta2 * exp_avg_sq[i] + c.one_minus_beta2 * (g * g);
    const M denom = std::sqrt(v) / c.bias_correction2_sqrt + c.eps;
    const M p = master[i] * c.decay - c.step_size * (m / denom);
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    master[i] = p;
    if (out.data) store_compute(out, i, p);
  }
}

template AdamWScalars<float> adamw_scalars<float>(const AdamWStep&);
template AdamWScalars<double> adamw_scalars<double>(const AdamWStep&);
template double sum_of_squares<float>(std::span<const float>);
template double sum_of_squares<double>(std::span<const double>);
template void adamw_update<float>(const AdamWStep&, float*, float*, float*, const float*, int64_t, ComputeWeights);
template void adamw_update<double>(const AdamWStep&, double*, double*, double*, const double*, int64_t,
                                   ComputeWeights);

}  // namespace ringtrain::train
