// Timing of device work for the benchmarks: a clock that marks points in a device's work (host wall time on the CPU,
// CUDA events on a GPU stream), and warm-up runs followed by timed runs summarised by medians.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "ringtrain/comm/communicator.h"
#include "ringtrain/core/tensor.h"

namespace ringtrain::check {

class DeviceClock {
 public:
  // stream: the cudaStream_t the timed work is enqueued on (nullptr: the default stream); ignored on the CPU.
  static std::unique_ptr<DeviceClock> make(Device dev, void* stream = nullptr);
  virtual ~DeviceClock() = default;
  // A point after the work enqueued so far.
  virtual void mark() = 0;
  // Waits for the device, then returns the milliseconds from the first mark to each later one, and forgets the marks.
  virtual std::vector<double> finish() = 0;
};

// The median (the mean of the two middle values of an even count); an error for no values.
double median(std::vector<double> v);
// The largest of the ranks' values (fp64): a benchmark's time is its slowest rank's, since every rank waits for the
// others in the collectives anyway.
double max_over_ranks(comm::Communicator& world, double value);
inline double gib(double bytes) { return bytes / double(1 << 30); }

// ms[i][k]: timed run i, milliseconds from the run's start to its k-th mark (the last one is the run's end).
struct TimedRuns {
  std::vector<std::vector<double>> ms;
  double median_to(size_t mark) const;                   // median time from the start to `mark`
  double median_between(size_t from, size_t to) const;   // median time between two marks
  size_t marks() const { return ms.empty() ? 0 : ms.front().size(); }
};

// Runs step(iteration, clock) `warmup` untimed times, then `iters` timed ones (iters >= 1). Before each run:
// before_each() (e.g. a barrier of the ranks); the run starts with a mark, step may mark points inside it, and
// the run ends with a mark and the device synchronised.
TimedRuns time_runs(Device dev, void* stream, int warmup, int iters,
                    const std::function<void(int iteration, DeviceClock& clock)>& step,
                    const std::function<void()>& before_each = {});

}  // namespace ringtrain::check
