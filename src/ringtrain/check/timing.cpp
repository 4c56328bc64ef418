#include "ringtrain/check/timing.h"

#include <algorithm>
#include <chrono>

#include "ringtrain/check/device_checks.h"
#include "ringtrain/core/error.h"

namespace ringtrain::check {
namespace {

// Host wall time: CPU work runs on the calling thread, so a mark is taken when the work before it is done.
class HostClock final : public DeviceClock {
 public:
  void mark() override { marks_.push_back(std::chrono::steady_clock::now()); }
  std::vector<double> finish() override {
    std::vector<double> ms;
    for (size_t i = 1; i < marks_.size(); ++i)
      ms.push_back(std::chrono::duration<double, std::milli>(marks_[i] - marks_.front()).count());
    marks_.clear();
    return ms;
  }

 private:
  std::vector<std::chrono::steady_clock::time_point> marks_;
};

}  // namespace

std::unique_ptr<DeviceClock> DeviceClock::make(Device dev, void* stream) {
  if (dev.is_cpu()) return std::make_unique<HostClock>();
  return make_cuda_clock(dev, stream);
}

double median(std::vector<double> v) {
  RT_CHECK(!v.empty(), "median of no values");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double max_over_ranks(comm::Communicator& world, double value) {
  Tensor t = Tensor::empty({1}, DType::F64, world.device());
  const TensorView host = contiguous_view(&value, DType::F64, Device::cpu(), {1});
  copy(t, host);
  world.all_reduce(t.data(), 1, DType::F64, comm::ReduceOp::Max);
  copy(host, t);
  return value;
}

double TimedRuns::median_to(size_t mark) const {
  std::vector<double> v;
  for (const auto& run : ms) v.push_back(run.at(mark));
  return median(v);
}

double TimedRuns::median_between(size_t from, size_t to) const {
  std::vector<double> v;
  for (const auto& run : ms) v.push_back(run.at(to) - run.at(from));
  return median(v);
}

TimedRuns time_runs(Device dev, void* stream, int warmup, int iters,
                    const std::function<void(int, DeviceClock&)>& step, const std::function<void()>& before_each) {
  RT_CHECK(warmup >= 0 && iters >= 1, "time_runs: ", warmup, " warm-up and ", iters, " timed runs");
  const std::unique_ptr<DeviceClock> clock = DeviceClock::make(dev, stream);
  TimedRuns runs;
  for (int it = 0; it < warmup + iters; ++it) {
    if (before_each) before_each();
    clock->mark();
    step(it, *clock);
    clock->mark();
    std::vector<double> ms = clock->finish();
    if (it >= warmup) runs.ms.push_back(std::move(ms));
  }
  return runs;
}

}  // namespace ringtrain::check
