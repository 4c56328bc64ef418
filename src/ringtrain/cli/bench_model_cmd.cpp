// `ringtrain bench model`: times training steps of a causal LM with random weights on one GPU or, with --cp N, on N
// GPUs with context parallelism (one process per GPU); what a step is and how FLOPs, MFU and memory are counted:
// check/cuda/model_bench.cpp. One row per shape, the phases of rank 0 below it, and one machine-readable line per
// shape that starts with "BENCH_MODEL " followed by JSON.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ringtrain/check/device_checks.h"
#include "ringtrain/cli/commands.h"
#include "ringtrain/cli/multi_gpu.h"
#include "ringtrain/cli/options.h"
#include "ringtrain/core/error.h"

namespace ringtrain::cli {
namespace {

struct BenchModelOpts {
  ModelShapeOptions shape;
  check::ModelBenchOptions bench;
  std::string model_backends, backends;
  std::vector<int64_t> seqs{8192, 32768};
  int cp = 1;
  int64_t timeout_ms = 600000;
};

void run_model_bench(BenchModelOpts& o) {
  check::ModelBenchOptions& b = o.bench;
  b.arch = o.shape.arch;
  b.layers = o.shape.layers, b.hidden = o.shape.hidden, b.heads = o.shape.heads, b.kv_heads = o.shape.kv_heads;
  b.head_dim = o.shape.head_dim, b.ffn = o.shape.ffn, b.vocab = o.shape.vocab;
  b.seqs = o.seqs;
  if (!o.model_backends.empty()) b.model_backends = attention::parse_backend_list(o.model_backends);
  const RootBackends root(o.backends, "--backends");
  std::unique_ptr<comm::Communicator> comm;
  if (o.cp > 1) comm = nccl_from_environment(std::chrono::milliseconds(o.timeout_ms));
  const bool lead = !comm || comm->rank() == 0;
  check::ModelBenchReport report;
  report.header = [&](const std::string& gpu, double matmul_weights) {
    if (!lead) return;
    std::printf("model benchmark on %d x %s: %s L=%lld hidden=%lld heads=%lld/%lld head_dim=%lld ffn=%lld vocab=%lld "
                "%s, bf16, checkpoint=%s, backends=%s, model backends=%s, warm-up %d, median of %d\n",
                o.cp, gpu.c_str(), b.arch.c_str(), static_cast<long long>(b.layers), static_cast<long long>(b.hidden),
                static_cast<long long>(b.heads), static_cast<long long>(b.kv_heads),
                static_cast<long long>(b.head_dim), static_cast<long long>(b.ffn), static_cast<long long>(b.vocab),
                b.untied ? "untied" : "tied", b.checkpoint.c_str(),
                o.backends.empty() ? "default" : o.backends.c_str(),
                o.model_backends.empty() ? "all" : o.model_backends.c_str(), b.warmup, b.iters);
    std::printf("FLOPs/step = 6*N*S + 6*L*S^2*(heads*head_dim), N = %.4g matmul weights; MFU vs %.0f TFLOP/s per GPU\n",
                matmul_weights, check::kPeakBf16Flops / 1e12);
    std::printf("%8s %4s %10s %12s %12s %7s %10s %12s\n", "S", "cp", "step_ms", "tokens/s", "TFLOP/s/GPU", "MFU",
                "peak_GiB", "logprob_GiB");
  };
  report.row = [&](const nlohmann::json& row) {
    if (!lead) return;
    const long long seq = row["seq"].get<long long>();
    if (row["status"] == "ok") {
      std::printf("%8lld %4d %10.1f %12.0f %12.1f %6.1f%% %10.1f %12.3f\n", seq, row["cp"].get<int>(),
                  row["step_ms"].get<double>(), row["tokens_per_s"].get<double>(),
                  row["tflops_per_gpu"].get<double>(), 100 * row["mfu"].get<double>(),
                  row["peak_pool_gib"].get<double>(), row["logprob_extra_gib"].get<double>());
      std::printf("%8s phases (rank 0): forward %.1f ms, LM head %.1f ms, backward %.1f ms\n", "",
                  row["forward_ms"].get<double>(), row["lm_head_ms"].get<double>(), row["backward_ms"].get<double>());
    } else {
      std::printf("%8lld %4d  %s\n", seq, o.cp, row["status"].get<std::string>().c_str());
    }
    std::printf("BENCH_MODEL %s\n", row.dump().c_str());
    std::fflush(stdout);
  };
  check::run_model_bench(b, comm.get(), report);
}

}  // namespace

void add_bench_model_command(CLI::App& app) {
  auto o = std::make_shared<BenchModelOpts>();
  o->shape.layers = 16, o->shape.hidden = 2048, o->shape.heads = 32, o->shape.kv_heads = 8, o->shape.head_dim = 64;
  o->shape.ffn = 8192, o->shape.vocab = 128256;
  CLI::App* bench = app.get_subcommand("bench");
  CLI::App* cmd = bench->add_subcommand("model", "Time training steps (forward, logprobs, backward) of a random model");
  o->shape.add_to(*cmd);
  cmd->add_flag("--untied", o->bench.untied, "a separate lm_head (default: tied to the embeddings, as Llama-3.2-1B)");
  cmd->add_option("--seq", o->seqs, "comma-separated sequence lengths (tokens per step)")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{2}, kMaxSeq))
      ->capture_default_str();
  add_bounded(*cmd, "--cp", o->cp, "GPUs (context parallelism)", 1, kMaxRanks)->capture_default_str();
  cmd->add_option("--cp-comm", o->bench.cp_comm, "ring, allgather or a2a")->check(cp_comm_check())->capture_default_str();
  cmd->add_option("--checkpoint", o->bench.checkpoint, "activation checkpointing: all or none")
      ->check(CLI::IsMember({"all", "none"}))
      ->capture_default_str();
  cmd->add_option("--backends", o->backends, "the root attention allow-list, e.g. cudnn,flash")
      ->check(backend_list_check());
  cmd->add_option("--model-backends", o->model_backends, "the model's own attention allow-list (default: all)")
      ->check(backend_list_check());
  add_bounded(*cmd, "--chunk", o->bench.chunk, "tokens per LM-head chunk (default: within the 896 MiB budget)",
              int64_t{1}, kMaxSeq);
  add_bounded(*cmd, "--iters", o->bench.iters, "timed steps (median reported)", 1, kMaxIters)->capture_default_str();
  add_bounded(*cmd, "--warmup", o->bench.warmup, "untimed steps first", 0, kMaxIters)->capture_default_str();
  cmd->add_option("--seed", o->bench.seed)->check(seed_check())->capture_default_str();
  add_timeout_ms(*cmd, o->timeout_ms);
  cmd->callback([o] {
    require_gpus(o->cp, "bench model");
    if (o->cp > 1 && !inside_ranks(o->cp)) throw relaunch_self(o->cp);
    run_model_bench(*o);
  });
}

}  // namespace ringtrain::cli
