#include "ringtrain/train/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "ringtrain/core/error.h"

namespace ringtrain::train {

void validate(const ScheduleConfig& cfg) {
  RT_CHECK(std::isfinite(cfg.base_lr) && cfg.base_lr >= 0, "LR schedule: base_lr ", cfg.base_lr, " must be >= 0");
  RT_CHECK(cfg.warmup_steps >= 0, "LR schedule: warmup_steps ", cfg.warmup_steps, " < 0");
  RT_CHECK(cfg.warmup_start_factor >= 0 && cfg.warmup_start_factor <= 1, "LR schedule: warmup_start_factor ",
           cfg.warmup_start_factor, " must be in [0, 1]");
  if (cfg.decay == ScheduleConfig::Decay::Cosine) {
    RT_CHECK(cfg.decay_steps > 0, "LR schedule: cosine decay needs decay_steps > 0, got ", cfg.decay_steps);
    RT_CHECK(std::isfinite(cfg.min_lr) && cfg.min_lr >= 0 && cfg.min_lr <= cfg.base_lr, "LR schedule: min_lr ",
             cfg.min_lr, " must be in [0, base_lr = ", cfg.base_lr, "]");
  }
}

std::string describe(const ScheduleConfig& cfg) {
  if (cfg.decay == ScheduleConfig::Decay::Cosine)
    return cat("cosine from lr ", cfg.base_lr, " over ", cfg.warmup_steps + cfg.decay_steps, " steps (",
               cfg.warmup_steps, " of warm-up) to ", cfg.min_lr);
  return cat("constant lr ", cfg.base_lr, cfg.warmup_steps > 0 ? cat(" after ", cfg.warmup_steps, " warm-up steps") : "");
}

double lr_at(const ScheduleConfig& cfg, int64_t position) {
  RT_CHECK(position >= 0, "LR schedule: position ", position, " < 0");
  if (position < cfg.warmup_steps) {
    const double f = cfg.warmup_start_factor +
                     (1.0 - cfg.warmup_start_factor) * static_cast<double>(position) / static_cast<double>(cfg.warmup_steps);
    return cfg.base_lr * f;
  }
  if (cfg.decay == ScheduleConfig::Decay::Constant) return cfg.base_lr;
  const double t = static_cast<double>(std::min(position - cfg.warmup_steps, cfg.decay_steps));
  const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * t / static_cast<double>(cfg.decay_steps)));
  return cfg.min_lr + (cfg.base_lr - cfg.min_lr) * cosine;
}

LRSchedule::LRSchedule(const ScheduleConfig& cfg) : cfg_(cfg) { validate(cfg); }

void LRSchedule::set_position(int64_t position) {
  RT_CHECK(position >= 0, "LR schedule: position ", position, " < 0");
  position_ = position;
}

}  // namespace ringtrain::train
