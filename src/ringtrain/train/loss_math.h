// The per-token arithmetic of the losses, one definition for the host losses (losses.cpp) and their device kernels
// (cuda/loss_kernels.cu), so that both compute every token the same way.
#pragma once

#include <math.h>

#include "ringtrain/core/host_device.h"
#include "ringtrain/train/losses.h"

namespace ringtrain::train {

RT_HOST_DEVICE inline double clamp_to(double v, double lo, double hi) { return v < lo ? lo : (hi < v ? hi : v); }

// log(1 + eˣ) without overflow, and the logistic function.
RT_HOST_DEVICE inline double softplus(double x) { return fmax(x, 0.0) + log1p(exp(-fabs(x))); }
RT_HOST_DEVICE inline double sigmoid(double x) {
  if (x >= 0) return 1.0 / (1.0 + exp(-x));
  const double e = exp(x);
  return e / (1.0 + e);
}

// The importance weight exp(prev - gen) of a token sampled from the generator's policy; one too large for a double
// is 0, so that the token drops out instead of making the step's loss infinite (as NeMo RL's nan_to_num does).
RT_HOST_DEVICE inline double importance_weight(double prev, double gen) {
  const double w = exp(prev - gen);
  return isinf(w) ? 0.0 : w;
}

// The k3 estimate of KL(prev || cur) at a token sampled from prev: e^x - 1 - x with x = cur - prev (PPO's
// "approx_kl" as CleanRL computes it).
RT_HOST_DEVICE inline double approx_kl_term(double cur, double prev) {
  const double x = cur - prev;
  return expm1(x) - x;
}

// One counted token of the clipped PG.
struct PGToken {
  double loss;  // w·pg + beta·kl
  double grad;  // d(loss)/d(cur)
  bool clipped;  // the ratio-clipped branch is strictly larger
  bool dual_clipped;
  double kl;  // clamped kl value (0 without beta)
};

RT_HOST_DEVICE inline PGToken pg_token(double cur, double prev, double adv, double ref, double weight,
                                       const ClippedPGConfig& cfg) {
  PGToken t{0, 0, false, false, 0};
  const double r = exp(cur - prev);
  double pg = 0, dpg = 0;
  if (adv != 0) {  // A = 0 contributes exactly 0 even where r overflows (0·inf would be NaN)
    const double unclipped = -adv * r;
    const double clipped = -adv * clamp_to(r, 1.0 - cfg.eps_low, 1.0 + cfg.eps_high);
    if (clipped > unclipped) {  // only possible with r outside the clip range, where the branch is constant
      pg = clipped;
      t.clipped = true;
    } else {
      pg = unclipped;
      dpg = -adv * r;
    }
    if (cfg.dual_clip > 0 && adv < 0 && pg > -adv * cfg.dual_clip) {
      pg = -adv * cfg.dual_clip;
      dpg = 0;
      t.dual_clipped = true;
    }
  }
  double dkl = 0;
  if (cfg.kl_beta != 0) {
    const double x_raw = ref - cur;
    const double x = clamp_to(x_raw, -20.0, 20.0);
    const double dx = x == x_raw ? -1.0 : 0.0;  // d(x)/d(cur)
    double k = 0, dk = 0;
    switch (cfg.kl_estimator) {
      case KLEstimator::K1: k = -x, dk = -1; break;
      case KLEstimator::K2: k = 0.5 * x * x, dk = x; break;
      case KLEstimator::K3: k = expm1(x) - x, dk = expm1(x); break;
    }
    t.kl = clamp_to(k, -10.0, 10.0);
    dkl = t.kl == k ? dk * dx : 0.0;
  }
  // The importance weight corrects the policy gradient only; the KL to the reference is not reweighted (NeMo RL).
  t.loss = weight * pg + cfg.kl_beta * t.kl;
  t.grad = weight * dpg + cfg.kl_beta * dkl;
  if (isnan(cur) || isnan(prev) || isnan(adv) || isnan(ref) || isnan(weight)) t.loss = t.grad = NAN;
  return t;
}

}  // namespace ringtrain::train
