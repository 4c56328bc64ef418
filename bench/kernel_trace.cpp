// A kernel and copy tracer for any CUDA program, loaded by the driver through CUDA_INJECTION64_PATH: CUPTI's activity
// records (no hardware counters, so it also works where ncu cannot read them) written as CSV at exit, one line per
// kernel or memory copy:
//   kernel,START_NS,END_NS,STREAM,GRID,BLOCK,NAME
//   memcpy,START_NS,END_NS,STREAM,KIND,BYTES,
// KIND is CUPTI's copy kind (1 = host to device, 2 = device to host, 8 = device to device, 10 = peer).
//
//   CUDA_INJECTION64_PATH=build/libringtrain_kernel_trace.so RINGTRAIN_KERNEL_TRACE=trace.csv PROGRAM ...
//   python3 bench/kernel_trace_summary.py trace.csv
#include <cupti.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace {

std::mutex g_mutex;
FILE* g_out = nullptr;

void report_cupti(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* text = nullptr;
  cuptiGetResultString(r, &text);
  std::fprintf(stderr, "kernel_trace: %s failed: %s\n", what, text ? text : "unknown CUPTI error");
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  constexpr size_t kBytes = size_t{8} << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBytes));
  *size = *buffer ? kBytes : 0;
  *max_records = 0;
}

// Names may hold commas (template arguments): quoted, with inner quotes doubled.
void write_name(const char* name) {
  std::fputc('"', g_out);
  for (const char* c = name ? name : "?"; *c; ++c) {
    if (*c == '"') std::fputc('"', g_out);
    std::fputc(*c, g_out);
  }
  std::fputs("\"\n", g_out);
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(g_mutex);
  CUpti_Activity* record = nullptr;
  while (g_out && cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || record->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
      std::fprintf(g_out, "kernel,%llu,%llu,%u,%dx%dx%d,%dx%dx%d,", static_cast<unsigned long long>(k->start),
                   static_cast<unsigned long long>(k->end), k->streamId, k->gridX, k->gridY, k->gridZ, k->blockX,
                   k->blockY, k->blockZ);
      write_name(k->name);
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
      std::fprintf(g_out, "memcpy,%llu,%llu,%u,%u,%llu,\n", static_cast<unsigned long long>(m->start),
                   static_cast<unsigned long long>(m->end), m->streamId, static_cast<unsigned>(m->copyKind),
                   static_cast<unsigned long long>(m->bytes));
    }
  }
  std::free(buffer);
}

void finish() {
  report_cupti(cuptiActivityFlushAll(1), "cuptiActivityFlushAll");
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_out) std::fclose(g_out), g_out = nullptr;
}

}  // namespace

// The driver calls this once, at the first CUDA call of the process.
extern "C" __attribute__((visibility("default"))) int InitializeInjection() {
  const char* path = std::getenv("RINGTRAIN_KERNEL_TRACE");
  g_out = std::fopen(path && *path ? path : "kernel_trace.csv", "w");
  if (!g_out) {
    std::perror("kernel_trace: opening RINGTRAIN_KERNEL_TRACE");
    return 0;
  }
  report_cupti(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
  report_cupti(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enabling kernel records");
  report_cupti(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "enabling copy records");
  std::atexit(finish);
  return 1;
}
