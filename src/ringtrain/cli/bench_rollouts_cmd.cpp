// `ringtrain bench rollouts`: the policy worker's get_logprobs and train steps on a rollout mix, packed against
// padded and against long sequences of the same total (worker/bench_rollouts.h). The model is --model (a checkpoint
// folder or builtin:<name>), else a random one of the --arch/--layers/... shape (default: Llama-3.2-1B, as `bench
// train`) written to a temporary checkpoint folder that every layout's worker loads. One GPU (bf16), or --device cpu
// (fp32: a tiny shape and a few short sequences, for a smoke test). One machine-readable line starts with
// "BENCH_ROLLOUTS " followed by JSON; --json FILE writes the same report.
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "ringtrain/cli/commands.h"
#include "ringtrain/cli/multi_gpu.h"
#include "ringtrain/cli/options.h"
#include "ringtrain/comm/in_process.h"
#include "ringtrain/core/device_info.h"
#include "ringtrain/core/error.h"
#include "ringtrain/model/file_io.h"
#include "ringtrain/model/params.h"
#include "ringtrain/train/bench_train.h"
#include "ringtrain/worker/bench_rollouts.h"

namespace ringtrain::cli {
namespace {

namespace fs = std::filesystem;

struct BenchRolloutsCli {
  worker::BenchRolloutsOptions bench;
  ModelShapeOptions shape = ModelShapeOptions::llama_1b();
  std::string device = "cuda", backends, json;
  bool untied = false, no_train = false;
  int64_t timeout_ms = 600000;
};

// While it lives, SIGINT and SIGTERM remove a folder (the benchmark's temporary checkpoint: 2.5 GB at the
// Llama-3.2-1B shape) and then end the process by the signal. Both signals are blocked in every thread started after
// it (the workers' ranks, CUDA's: make it before any CUDA call) and taken by a thread of its own.
class RemoveOnSignal {
 public:
  RemoveOnSignal() {
    sigemptyset(&signals_);
    sigaddset(&signals_, SIGINT);
    sigaddset(&signals_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals_, &previous_);
    waiter_ = std::thread([this] {
      siginfo_t info{};
      int sig = 0;
      do {
        sig = sigwaitinfo(&signals_, &info);
      } while (sig < 0);
      // The destructor's own wake-up (sent by this process); any other signal, even during the teardown, is the
      // user's (a terminal's Ctrl-C comes from the kernel, a kill from another process).
      if (closing_.load() && info.si_pid == ::getpid()) return;
      std::error_code ec;
      const std::lock_guard<std::mutex> lock(mu_);
      if (!folder_.empty()) fs::remove_all(folder_, ec);
      std::signal(sig, SIG_DFL);
      sigset_t one;
      sigemptyset(&one);
      sigaddset(&one, sig);
      pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
      std::raise(sig);
    });
  }
  ~RemoveOnSignal() {
    closing_.store(true);
    pthread_kill(waiter_.native_handle(), SIGTERM);
    waiter_.join();
    pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
  }
  RemoveOnSignal(const RemoveOnSignal&) = delete;
  RemoveOnSignal& operator=(const RemoveOnSignal&) = delete;
  void remove_at_signal(const fs::path& folder) {
    const std::lock_guard<std::mutex> lock(mu_);
    folder_ = folder;
  }

 private:
  sigset_t signals_{}, previous_{};
  std::atomic<bool> closing_{false};
  std::mutex mu_;
  fs::path folder_;
  std::thread waiter_;
};

// A checkpoint folder that is removed when the benchmark ends (and by `on_signal` at a signal).
class TempCheckpoint {
 public:
  TempCheckpoint(const model::ModelConfig& c, uint64_t seed, RemoveOnSignal& on_signal)
      : dir_(fs::temp_directory_path() / ("ringtrain-bench-rollouts-" + std::to_string(::getpid()))) {
    on_signal.remove_at_signal(dir_);
    try {
      fs::remove_all(dir_);
      model::save_checkpoint(dir_, c, train::random_weights(c, seed), model::ExistingCheckpoint::Refuse);
    } catch (...) {
      remove();
      throw;
    }
  }
  ~TempCheckpoint() { remove(); }
  TempCheckpoint(const TempCheckpoint&) = delete;
  TempCheckpoint& operator=(const TempCheckpoint&) = delete;
  const fs::path& dir() const { return dir_; }

 private:
  void remove() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  fs::path dir_;
};

void print_report(const nlohmann::json& r) {
  const nlohmann::json& m = r["model"];
  const nlohmann::json& mix = r["mix"];
  std::printf("rollouts benchmark: %s L=%lld hidden=%lld heads=%lld/%lld head_dim=%lld ffn=%lld vocab=%lld, %s on %s"
              ", loss %s, warm-up %d, median of %d\n",
              m["arch"].get<std::string>().c_str(), m["layers"].get<long long>(), m["hidden"].get<long long>(),
              m["heads"].get<long long>(), m["kv_heads"].get<long long>(), m["head_dim"].get<long long>(),
              m["ffn"].get<long long>(), m["vocab"].get<long long>(), m["dtype"].get<std::string>().c_str(),
              r["device"].get<std::string>().c_str(), r["loss"].get<std::string>().c_str(), r["warmup"].get<int>(),
              r["iters"].get<int>());
  std::printf("mix: %lld sequences, lengths log-uniform in [%lld, %lld] (seed %llu; shortest %lld, longest %lld), "
              "%lld tokens; packed rows of %lld tokens; padded microbatches of %lld sequences\n",
              mix["sequences"].get<long long>(), mix["min_len"].get<long long>(), mix["max_len"].get<long long>(),
              mix["seed"].get<unsigned long long>(), mix["shortest"].get<long long>(), mix["longest"].get<long long>(),
              mix["tokens"].get<long long>(), r["mb_tokens"].get<long long>(), r["padded_batch"].get<long long>());
  const nlohmann::json& lg = r["long"];
  std::printf("long: the same %lld tokens as %lld sequence(s) of up to %lld tokens (cut at --long-len)\n",
              lg["tokens"].get<long long>(), lg["sequences"].get<long long>(), lg["sequence_tokens"].get<long long>());
  std::printf("%-9s %-8s %6s %11s %11s %6s %10s %12s\n", "pass", "layout", "seqs", "tokens", "processed", "mbs",
              "seconds", "tokens/s");
  for (const auto& row : r["rows"])
    std::printf("%-9s %-8s %6lld %11lld %11lld %6lld %10.4f %12.0f\n", row["pass"].get<std::string>().c_str(),
                row["layout"].get<std::string>().c_str(), row["sequences"].get<long long>(),
                row["tokens"].get<long long>(), row["processed_tokens"].get<long long>(),
                row["microbatches"].get<long long>(), row["seconds"].get<double>(), row["tokens_per_s"].get<double>());
  for (const auto& [pass, q] : r["ratios"].items()) {
    std::printf("%-9s packed/padded %.2fx (bar >= %.2f), packed/long %.2f (bar >= %.2f)", pass.c_str(),
                q["packed_over_padded"].get<double>(), r["bar"]["packed_over_padded_min"].get<double>(),
                q["packed_over_long"].get<double>(), r["bar"]["packed_over_long_min"].get<double>());
    if (q.contains("packed_over_dynamic"))
      std::printf(", packed/dynamic %.2fx", q["packed_over_dynamic"].get<double>());
    std::printf(": %s\n", q["meets_bar"].get<bool>() ? "meets the bar" : "below the bar");
  }
  std::printf("logprobs packed vs padded: max |difference| %.3g\n",
              r["logprobs_max_abs_diff_packed_vs_padded"].get<double>());
  std::printf("BENCH_ROLLOUTS %s\n", r.dump().c_str());
  std::fflush(stdout);
}

void run(BenchRolloutsCli& o) {
  worker::BenchRolloutsOptions& b = o.bench;
  b.train = !o.no_train;
  if (!o.backends.empty()) b.backends = attention::parse_backend_list(o.backends);
  const auto timeout = std::chrono::milliseconds(o.timeout_ms);
  RT_CHECK(o.device == "cuda" || o.device == "cpu", "bench rollouts: --device ", o.device, ": expected cuda or cpu");
  const bool cuda = o.device == "cuda";
  std::optional<RemoveOnSignal> on_signal;  // before any CUDA call, which starts threads of its own
  if (b.model_name.empty()) on_signal.emplace();
  if (cuda) require_cuda("bench rollouts");
  std::unique_ptr<TempCheckpoint> folder;
  if (b.model_name.empty()) {
    model::ModelConfig m = o.shape.apply_to(train::llama_1b_config(), !o.untied);
    m.dtype = cuda ? DType::BF16 : DType::F32;  // the policy's compute dtype: nothing lost in the file
    m = model::parse_config(model::config_to_json(m), "bench rollouts model options");
    folder = std::make_unique<TempCheckpoint>(m, b.seed, *on_signal);
    b.model_name = folder->dir().string();
  }
  nlohmann::json report;
  if (cuda) {
    const std::unique_ptr<comm::Communicator> world = nccl_from_environment(timeout);
    b.device = world->device();
    report = worker::run_rollouts_bench(b, *world);
  } else {
    b.device = Device::cpu();
    comm::run_ranks(1, timeout, [&](comm::Communicator& world) { report = worker::run_rollouts_bench(b, world); });
  }
  if (folder) report["model"]["model_name"] = "random (" + o.shape.arch + " shape options)";
  print_report(report);
  if (!o.json.empty()) model::write_file_atomic(o.json, report.dump(2) + "\n");
}

}  // namespace

void add_bench_rollouts_command(CLI::App& app) {
  auto o = std::make_shared<BenchRolloutsCli>();
  worker::BenchRolloutsOptions& b = o->bench;
  CLI::App* cmd = app.get_subcommand("bench")->add_subcommand(
      "rollouts", "Time the policy worker's logprobs and train steps on a rollout mix: packed, padded, long");
  cmd->add_option("--device", o->device, "cuda or cpu")->capture_default_str();
  add_bounded(*cmd, "--sequences", b.sequences, "sequences of the mix", int64_t{1}, kMaxBatch)->capture_default_str();
  add_bounded(*cmd, "--min-len", b.min_len, "shortest length of the log-uniform mix", int64_t{1}, kMaxSeq)
      ->capture_default_str();
  add_bounded(*cmd, "--max-len", b.max_len, "longest length of the log-uniform mix", int64_t{1}, kMaxSeq)
      ->capture_default_str();
  cmd->add_option("--seed", b.seed, "lengths, tokens and weights")->check(seed_check())->capture_default_str();
  add_bounded(*cmd, "--mb-tokens", b.mb_tokens, "tokens per packed row (logprob_mb_tokens = train_mb_tokens)",
              int64_t{1}, kMaxSeq)
      ->capture_default_str();
  add_bounded(*cmd, "--padded-batch", b.padded_batch,
              "sequences per padded microbatch (logprob_batch_size = train_micro_batch_size)", int64_t{1}, kMaxBatch)
      ->capture_default_str();
  add_bounded(*cmd, "--long-len", b.long_len, "tokens per sequence of the long layout (default: --mb-tokens)",
              int64_t{0}, kMaxSeq);
  cmd->add_flag("--dynamic", b.dynamic, "also time dynamic batching (length buckets of --mb-tokens padded tokens)");
  cmd->add_flag("--no-train", o->no_train, "time get_logprobs only");
  cmd->add_option("--loss", b.loss, "nll or clipped_pg")->capture_default_str();
  add_bounded(*cmd, "--iters", b.iters, "timed calls (median reported)", 1, kMaxIters)->capture_default_str();
  add_bounded(*cmd, "--warmup", b.warmup, "untimed calls first", 0, kMaxIters)->capture_default_str();
  cmd->add_option("--json", o->json, "also write the report to this JSON file");
  cmd->add_option("--model", b.model_name, "a checkpoint folder or builtin:<name> instead of the shape options");
  o->shape.add_to(*cmd);
  cmd->add_flag("--untied", o->untied, "a separate lm_head (default: tied, as Llama-3.2-1B)");
  cmd->add_option("--backends", o->backends, "the attention allow-list (default: all)");
  add_bounded(*cmd, "--chunk", b.logprob_chunk, "tokens per LM-head chunk (default: the device's)", int64_t{0},
              kMaxSeq);
  cmd->add_flag("--activation-checkpointing", b.activation_checkpointing, "recompute every layer in backward");
  cmd->add_option("--timeout-ms", o->timeout_ms, "communicator timeout")->capture_default_str();
  cmd->callback([o, cmd] {
    if (!o->bench.model_name.empty()) {
      const std::string shape = cmd->count("--untied") > 0 ? "--untied" : ModelShapeOptions::first_given(*cmd);
      RT_CHECK(shape.empty(), "bench rollouts: --model names the model; drop ", shape);
    }
    if (!o->json.empty()) {  // found before the benchmark runs, not after
      const std::filesystem::path parent = std::filesystem::absolute(o->json).parent_path();
      RT_CHECK(std::filesystem::is_directory(parent), "bench rollouts: --json ", o->json, ": ", parent.string(),
               " is not a directory");
      const std::filesystem::file_type type = std::filesystem::symlink_status(o->json).type();
      RT_CHECK(type == std::filesystem::file_type::not_found || type == std::filesystem::file_type::regular,
               "bench rollouts: --json ", o->json, ": exists and is not a regular file");
    }
    run(*o);
  });
}

}  // namespace ringtrain::cli
