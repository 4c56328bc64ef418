// `ringtrain bench generate`: batched generation with the GPU sampler (model/cuda/gpu_sampler.h) on a model with
// random weights, the Llama-3.2-1B shape by default; what is timed and counted: check/cuda/generate_bench.cpp. One
// summary, then one machine-readable line that starts with "BENCH_GENERATE " followed by JSON
// (bench/compare_hf_generate.py reads it).
#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "ringtrain/check/device_checks.h"
#include "ringtrain/cli/commands.h"
#include "ringtrain/cli/multi_gpu.h"
#include "ringtrain/cli/options.h"
#include "ringtrain/core/error.h"

namespace ringtrain::cli {
namespace {

struct BenchGenerateOpts {
  ModelShapeOptions shape = ModelShapeOptions::llama_1b();
  check::GenerateBenchOptions bench;
  std::string backends;
};

// The shape options into the benchmark's options, whose sizes are then checked: before a GPU is looked for, so
// that a run which could never fit is refused on any machine.
void resolve(BenchGenerateOpts& o) {
  check::GenerateBenchOptions& b = o.bench;
  b.arch = o.shape.arch;
  b.layers = o.shape.layers, b.hidden = o.shape.hidden, b.heads = o.shape.heads;
  b.kv_heads = o.shape.kv_heads > 0 ? o.shape.kv_heads : o.shape.heads;
  b.head_dim = o.shape.head_dim > 0 ? o.shape.head_dim : o.shape.hidden / o.shape.heads;
  b.ffn = o.shape.ffn > 0 ? o.shape.ffn : 4 * o.shape.hidden, b.vocab = o.shape.vocab;
  check::check_generate_bench_sizes(b);
  // The prefill's attention calls are not KV-cache calls: decode alone would fail at the first one, on the GPU.
  if (o.backends.empty()) return;
  bool other = false;
  for (attention::BackendId id : attention::parse_backend_list(o.backends))
    other = other || id != attention::BackendId::Decode;
  RT_CHECK(other, "bench generate: --backends ", o.backends, ": decode serves only the sampler's KV-cache calls; list "
           "a backend for the prefill too (e.g. decode,flash)");
}

void run(BenchGenerateOpts& o) {
  const check::GenerateBenchOptions& b = o.bench;
  const RootBackends root(o.backends, "--backends");
  const nlohmann::json r = check::run_generate_bench(b);
  std::printf("generate benchmark on %s: %s L=%lld hidden=%lld heads=%lld/%lld head_dim=%lld ffn=%lld vocab=%lld, "
              "bf16, batch %lld x prompt %lld + %lld new tokens (stop ids %lld: %.1f on average), temperature %g "
              "top_k %lld top_p %g, warm-up %d, median of %d\n",
              r["gpu"].get<std::string>().c_str(), b.arch.c_str(), static_cast<long long>(b.layers),
              static_cast<long long>(b.hidden), static_cast<long long>(b.heads), static_cast<long long>(b.kv_heads),
              static_cast<long long>(b.head_dim), static_cast<long long>(b.ffn), static_cast<long long>(b.vocab),
              static_cast<long long>(b.batch), static_cast<long long>(b.prompt), static_cast<long long>(b.new_tokens),
              static_cast<long long>(b.stop_ids), r["mean_new_tokens"].get<double>(), b.temperature, static_cast<long long>(b.top_k), b.top_p, b.warmup, b.iters);
  std::printf("prefill  %10.1f ms  %12.0f prompt tokens/s\n", r["prefill_ms"].get<double>(),
              r["prefill_tokens_per_s"].get<double>());
  std::printf("decode   %10.1f ms  %12.0f tokens/s  (%.3f ms/step, %.0f GB/s of weights + KV cache per step)\n",
              r["decode_ms"].get<double>(), r["decode_tokens_per_s"].get<double>(), r["decode_step_ms"].get<double>(),
              r["step_gb_per_s"].get<double>());
  std::printf("total    %10.1f ms  %12.0f new tokens/s\n", r["total_ms"].get<double>(),
              r["generate_tokens_per_s"].get<double>());
  std::printf("attention calls: %s\n", r["attention_calls"].get<std::string>().c_str());
  std::printf("BENCH_GENERATE %s\n", r.dump().c_str());
  std::fflush(stdout);
}

}  // namespace

void add_bench_generate_command(CLI::App& app) {
  auto o = std::make_shared<BenchGenerateOpts>();
  CLI::App* bench = app.get_subcommand("bench");
  CLI::App* cmd = bench->add_subcommand("generate", "Time batched generation (prefill, decoding) with the GPU sampler");
  o->shape.add_to(*cmd);
  add_bounded(*cmd, "--batch", o->bench.batch, "prompts per generate()", int64_t{1}, int64_t{65535})
      ->capture_default_str();
  add_bounded(*cmd, "--prompt", o->bench.prompt, "tokens per prompt", int64_t{1}, kMaxSeq)->capture_default_str();
  add_bounded(*cmd, "--new-tokens", o->bench.new_tokens, "new tokens per prompt", int64_t{2}, kMaxSeq)
      ->capture_default_str();
  add_bounded(*cmd, "--temperature", o->bench.temperature, "sampling temperature (0: greedy)", 0.0, 1e6)
      ->capture_default_str();
  add_bounded(*cmd, "--top-k", o->bench.top_k, "keep the k most likely tokens (0: all)", int64_t{0}, kMaxSeq)
      ->capture_default_str();
  add_bounded(*cmd, "--top-p", o->bench.top_p, "nucleus mass (1: all)", 1e-6, 1.0)->capture_default_str();
  add_bounded(*cmd, "--stop-ids", o->bench.stop_ids,
              "the token ids [0, N) end a sequence: varied lengths on the random model (0: none)", int64_t{0},
              int64_t{16777216})
      ->capture_default_str();
  add_bounded(*cmd, "--iters", o->bench.iters, "timed generate() calls (median reported)", 1, kMaxIters)
      ->capture_default_str();
  add_bounded(*cmd, "--warmup", o->bench.warmup, "untimed calls first", 0, kMaxIters)->capture_default_str();
  cmd->add_option("--seed", o->bench.seed)->check(seed_check())->capture_default_str();
  cmd->add_option("--backends", o->backends, "the root attention allow-list, e.g. decode,flash")
      ->check(backend_list_check());
  cmd->callback([o] {
    resolve(*o);
    require_gpus(1, "bench generate");
    run(*o);
  });
}

}  // namespace ringtrain::cli
