// DeviceClock on a GPU: CUDA events recorded on the timed work's stream.
#include <cuda_runtime_api.h>

#include "ringtrain/check/cuda/cuda_checks.h"
#include "ringtrain/core/cuda/check.h"
#include "ringtrain/core/error.h"

namespace ringtrain::check::cuda {
namespace {


class EventClock final : public DeviceClock {
 public:
  EventClock(Device dev, void* stream) : device_(dev.index), stream_(static_cast<cudaStream_t>(stream)) {}
  ~EventClock() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  EventClock(const EventClock&) = delete;
  EventClock& operator=(const EventClock&) = delete;

  void mark() override {
    if (used_ == events_.size()) {
      cudaEvent_t e;
      RT_CUDA_CHECK(cudaEventCreate(&e));
      events_.push_back(e);
    }
    RT_CUDA_CHECK(cudaEventRecord(events_[used_++], stream_));
  }

  std::vector<double> finish() override {
    // The whole device: the timed work may have enqueued on other streams (NCCL's) too.
    RT_CUDA_CHECK(cudaSetDevice(device_));
    RT_CUDA_CHECK(cudaDeviceSynchronize(), "synchronize after a timed run");
    std::vector<double> ms;
    for (size_t i = 1; i < used_; ++i) {
      float t = 0;
      RT_CUDA_CHECK(cudaEventElapsedTime(&t, events_[0], events_[i]));
      ms.push_back(t);
    }
    used_ = 0;
    return ms;
  }

 private:
  int device_;
  cudaStream_t stream_;
  std::vector<cudaEvent_t> events_;
  size_t used_ = 0;
};

}  // namespace

std::unique_ptr<DeviceClock> make_event_clock(Device dev, void* stream) {
  return std::make_unique<EventClock>(dev, stream);
}

std::string gpu_name(int device) {
  cudaDeviceProp prop{};
  RT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}

}  // namespace ringtrain::check::cuda
