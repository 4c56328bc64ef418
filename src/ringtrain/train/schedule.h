// Learning-rate schedule: linear warm-up from base_lr·warmup_start_factor to base_lr over warmup_steps, then either
// constant or a cosine from base_lr to min_lr over decay_steps (min_lr after that). It steps once per train step;
// its position (train steps taken) is part of the saved training state.
#pragma once

#include <cstdint>
#include <string>

namespace ringtrain::train {

struct ScheduleConfig {
  enum class Decay { Constant, Cosine };
  double base_lr = 5e-6;
  int64_t warmup_steps = 0;
  double warmup_start_factor = 1.0;  // in [0, 1]
  Decay decay = Decay::Constant;
  int64_t decay_steps = 0;  // cosine only: steps after the warm-up to reach min_lr (> 0)
  double min_lr = 0;        // cosine only
  bool operator==(const ScheduleConfig&) const = default;
};
void validate(const ScheduleConfig& cfg);
// "cosine from lr 0.001 over 100 steps (10 of warm-up) to 1e-05", "constant lr 0.001 after 2 warm-up steps".
std::string describe(const ScheduleConfig& cfg);

// The learning rate of the step at `position` (0 for the first train step).
double lr_at(const ScheduleConfig& cfg, int64_t position);

class LRSchedule {
 public:
  explicit LRSchedule(const ScheduleConfig& cfg);
  double lr() const { return lr_at(cfg_, position_); }  // for the current step
  void step() { ++position_; }                           // after each train step
  int64_t position() const { return position_; }
  void set_position(int64_t position);                   // restoring a checkpoint

 private:
  ScheduleConfig cfg_;
  int64_t position_ = 0;
};

}  // namespace ringtrain::train
