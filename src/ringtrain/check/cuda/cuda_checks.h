// The CUDA implementations behind check/device_checks.h (called only from device_checks.cpp).
#pragma once

#include "ringtrain/check/device_checks.h"

namespace ringtrain::check::cuda {

std::unique_ptr<DeviceClock> make_event_clock(Device dev, void* stream);
std::string gpu_name(int device);
DeviceRunResult run_cp_on_device(comm::Communicator& comm, const DeviceRunOptions& opt);
AttentionBenchRow bench_attention_backend(attention::BackendId id, const AttnProblem& prob, int warmup, int iters);
void run_model_bench(const ModelBenchOptions& opt, comm::Communicator* comm, const ModelBenchReport& report);
nlohmann::json run_generate_bench(const GenerateBenchOptions& opt);

}  // namespace ringtrain::check::cuda
