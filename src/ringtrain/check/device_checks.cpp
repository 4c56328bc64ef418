// The check layer's registration file: the GPU checks of device_checks.h come from check/cuda/ in a CUDA build, and
// say why they cannot run in the others.
#include "ringtrain/check/device_checks.h"

#include <limits>
#include <string>

#include "ringtrain/core/checked.h"
#include "ringtrain/core/error.h"
#ifdef RINGTRAIN_WITH_CUDA
#include "ringtrain/check/cuda/cuda_checks.h"
#endif

namespace ringtrain::check {

ParityReport DeviceRunResult::parity(double tolerance) const {
  ParityReport r;
  r.rows = {{"O", err_o, tolerance},
            {"LSE", err_lse, tolerance},
            {"dQ", err_dq, tolerance},
            {"dK", err_dk, tolerance},
            {"dV", err_dv, tolerance}};
  return r;
}

void check_generate_bench_sizes(const GenerateBenchOptions& o) {
  RT_CHECK(o.batch > 0 && o.prompt > 0 && o.new_tokens > 1 && o.iters >= 1 && o.warmup >= 0,
           "bench generate: batch, prompt and iters must be positive, new tokens at least 2");
  RT_CHECK(o.stop_ids >= 0 && o.stop_ids < o.vocab, "bench generate: --stop-ids ", o.stop_ids,
           " must leave some of the ", o.vocab, " token ids running");
  // The sampler's cache slots per prompt: the last draw is never fed back.
  const int64_t slots = checked_add(o.prompt, o.new_tokens - 1, "bench generate: --prompt + --new-tokens");
  RT_CHECK(slots < kGenerateBenchMaxPositions, "bench generate: --prompt ", o.prompt, " + --new-tokens ",
           o.new_tokens, " is more than the benchmark model's ", kGenerateBenchMaxPositions, " positions");
  const std::string what = "bench generate: the KV cache size";
  const int64_t rows = checked_mul(o.batch, slots, what);
  RT_CHECK(rows < std::numeric_limits<int32_t>::max(), "bench generate: --batch ", o.batch, " x ", slots,
           " cache slots (--prompt + --new-tokens - 1) do not fit int32 row indices");
  const int64_t bytes = checked_mul(
      checked_mul(checked_mul(checked_mul(rows, checked_mul(o.kv_heads, o.head_dim, what), what), 2, what),
                  o.layers, what),
      2, what);
  RT_CHECK(bytes <= kGenerateBenchMaxCacheBytes, "bench generate: the KV cache of --batch ", o.batch, " x ", slots,
           " slots (bf16, ", o.layers, " layers x ", o.kv_heads, " kv heads x ", o.head_dim,
           " dims, keys and values) needs ", bytes, " bytes, more than the benchmark's ", kGenerateBenchMaxCacheBytes);
}

#ifdef RINGTRAIN_WITH_CUDA
std::unique_ptr<DeviceClock> make_cuda_clock(Device dev, void* stream) { return cuda::make_event_clock(dev, stream); }
std::string gpu_name(int device) { return cuda::gpu_name(device); }
DeviceRunResult run_cp_on_device(comm::Communicator& comm, const DeviceRunOptions& opt) {
  return cuda::run_cp_on_device(comm, opt);
}
AttentionBenchRow bench_attention_backend(attention::BackendId id, const AttnProblem& prob, int warmup, int iters) {
  return cuda::bench_attention_backend(id, prob, warmup, iters);
}
void run_model_bench(const ModelBenchOptions& opt, comm::Communicator* comm, const ModelBenchReport& report) {
  cuda::run_model_bench(opt, comm, report);
}
nlohmann::json run_generate_bench(const GenerateBenchOptions& opt) { return cuda::run_generate_bench(opt); }
#else
namespace {
[[noreturn]] void no_cuda(const char* what) {
  throw Error(cat(what, ": not available in this build: ringtrain was built without CUDA support"));
}
}  // namespace
std::unique_ptr<DeviceClock> make_cuda_clock(Device dev, void*) { no_cuda("timing GPU work"); }
std::string gpu_name(int) { no_cuda("GPU name"); }
DeviceRunResult run_cp_on_device(comm::Communicator&, const DeviceRunOptions&) {
  no_cuda("context-parallel attention on GPUs");
}
AttentionBenchRow bench_attention_backend(attention::BackendId, const AttnProblem&, int, int) {
  no_cuda("the attention benchmark");
}
void run_model_bench(const ModelBenchOptions&, comm::Communicator*, const ModelBenchReport&) {
  no_cuda("the model benchmark");
}
nlohmann::json run_generate_bench(const GenerateBenchOptions&) { no_cuda("the generation benchmark"); }
#endif

}  // namespace ringtrain::check
