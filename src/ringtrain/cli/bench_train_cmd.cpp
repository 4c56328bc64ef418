// `ringtrain bench train`: full training steps through the Trainer (train/bench_train.h). On GPUs, --cp N re-runs
// itself on N ranks (one process per GPU, NCCL); --device cpu runs the same on in-process ranks (a smoke test with
// a small --layers/--hidden/--vocab). One machine-readable line starts with "BENCH_TRAIN " followed by JSON.
#include <cstdio>
#include <memory>

#include "ringtrain/cli/commands.h"
#include "ringtrain/cli/multi_gpu.h"
#include "ringtrain/cli/options.h"
#include "ringtrain/comm/in_process.h"
#include "ringtrain/core/device_info.h"
#include "ringtrain/core/error.h"
#include "ringtrain/train/bench_train.h"

namespace ringtrain::cli {
namespace {

struct BenchTrainCli {
  train::BenchTrainOptions bench;
  ModelShapeOptions shape = ModelShapeOptions::llama_1b();
  std::string device = "cuda";
  bool untied = false;
  int cp = 1;
  int64_t timeout_ms = 600000;
};

void print_row(const nlohmann::json& row) {
  std::printf("%8s %4s %5s %10s %12s %12s %7s %10s %10s\n", "S", "cp", "loss", "step_ms", "tokens/s", "TFLOP/s/GPU",
              "MFU", "peak_GiB", "optim_GiB");
  std::printf("%8lld %4d %5s %10.1f %12.0f %12.1f %6.1f%% %10.1f %10.2f\n", row["seq"].get<long long>(),
              row["cp"].get<int>(), row["loss_kind"].get<std::string>().c_str(), row["step_ms"].get<double>(),
              row["tokens_per_s"].get<double>(), row["tflops_per_gpu"].get<double>(), 100 * row["mfu"].get<double>(),
              row["peak_pool_gib"].get<double>(), row["optimizer_gib"].get<double>());
  std::printf("%8s phases (rank 0, ms):", "");
  for (const auto& p : row["phases_ms"])
    std::printf(" %s %.2f", p["phase"].get<std::string>().c_str(), p["ms"].get<double>());
  std::printf("\nBENCH_TRAIN %s\n", row.dump().c_str());
  std::fflush(stdout);
}

void run(BenchTrainCli& o) {
  train::BenchTrainOptions& b = o.bench;
  b.model = o.shape.apply_to(train::llama_1b_config(), !o.untied);
  const auto timeout = std::chrono::milliseconds(o.timeout_ms);
  if (o.device == "cpu") {
    nlohmann::json row;
    comm::run_ranks(o.cp, timeout, [&](comm::Communicator& world) {
      nlohmann::json mine = train::run_train_bench(b, world);
      if (world.rank() == 0) row = mine;
    });
    print_row(row);
    return;
  }
  RT_CHECK(o.device == "cuda", "bench train: --device ", o.device, ": expected cuda or cpu");
  require_gpus(o.cp, "bench train");
  if (o.cp > 1 && !inside_ranks(o.cp)) throw relaunch_self(o.cp);
  const std::unique_ptr<comm::Communicator> world = nccl_from_environment(timeout);
  const nlohmann::json row = train::run_train_bench(b, *world);
  if (world->rank() == 0) {
    std::printf("train benchmark: %s L=%lld hidden=%lld heads=%lld/%lld head_dim=%lld ffn=%lld vocab=%lld, bf16 "
                "weights, fp32 grads and AdamW state (ZeRO-2 over %d), warm-up %d, median of %d; MFU vs 989 TFLOP/s\n",
                o.shape.arch.c_str(), static_cast<long long>(b.model.layers), static_cast<long long>(b.model.hidden),
                static_cast<long long>(b.model.heads), static_cast<long long>(b.model.kv_heads),
                static_cast<long long>(b.model.head_dim), static_cast<long long>(b.model.ffn),
                static_cast<long long>(b.model.vocab), o.cp, b.warmup, b.steps);
    print_row(row);
  }
}

}  // namespace

void add_bench_train_command(CLI::App& app) {
  auto o = std::make_shared<BenchTrainCli>();
  CLI::App* cmd = app.get_subcommand("bench")->add_subcommand(
      "train", "Time full training steps (forward, loss, backward, reduce-scatter, clip, AdamW, all-gather)");
  cmd->add_option("--device", o->device, "cuda or cpu")->capture_default_str();
  add_bounded(*cmd, "--seq", o->bench.seq, "tokens per step (one sequence)", int64_t{2}, kMaxSeq)
      ->capture_default_str();
  add_bounded(*cmd, "--cp", o->cp, "GPUs (context parallelism; ZeRO-2 over them)", 1, kMaxRanks)
      ->capture_default_str();
  add_bounded(*cmd, "--steps", o->bench.steps, "timed steps", 1, kMaxIters)->capture_default_str();
  add_bounded(*cmd, "--warmup", o->bench.warmup, "untimed steps first", 0, kMaxIters)->capture_default_str();
  cmd->add_option("--loss", o->bench.loss, "nll or pg")->capture_default_str();
  o->shape.add_to(*cmd);
  cmd->add_flag("--untied", o->untied, "a separate lm_head (default: tied, as Llama-3.2-1B)");
  cmd->add_option("--backends", o->bench.backends, "the model's attention allow-list (default: all)");
  add_bounded(*cmd, "--chunk", o->bench.logprob_chunk, "tokens per LM-head chunk (default: the device's)", int64_t{0},
              kMaxSeq);
  cmd->add_option("--seed", o->bench.seed)->check(seed_check())->capture_default_str();
  cmd->add_option("--timeout-ms", o->timeout_ms, "communicator timeout")->capture_default_str();
  cmd->callback([o] { run(*o); });
}

}  // namespace ringtrain::cli
