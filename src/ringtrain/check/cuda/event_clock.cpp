// DeviceClock on a GPU: CUDA events recorded on the timed work's stream.
#include <cuda_runtime_api.h>

#include "ringtrain/check/cuda/cuda_checks.h"
#include "ringtrain/core/error.h"

namespace ringtrain::check::cuda {
namespace {

void check_cuda(cudaError_t e, const char* what) { RT_CHECK(e == cudaSuccess, what, ": ", cudaGetErrorString(e)); }

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
      check_cuda(cudaEventCreate(&e), "cudaEventCreate");
      events_.push_back(e);
    }
    check_cuda(cudaEventRecord(events_[used_++], stream_), "cudaEventRecord");
  }

  std::vector<double> finish() override {
    // The whole device: the timed work may have enqueued on other streams (NCCL's) too.
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    check_cuda(cudaDeviceSynchronize(), "synchronize after a timed run");
    std::vector<double> ms;
    for (size_t i = 1; i < used_; ++i) {
      float t = 0;
      check_cuda(cudaEventElapsedTime(&t, events_[0], events_[i]), "cudaEventElapsedTime");
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
  check_cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  return prop.name;
}

}  // namespace ringtrain::check::cuda
