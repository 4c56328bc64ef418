// The ringtrain subcommands, added by the files of cli/ (a file adds one, or a command and its relatives: train and
// export, bench and its parts); main.cpp lists them.
#pragma once

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ringtrain/check/attention_check.h"
#include "ringtrain/cli/exit.h"

namespace ringtrain::cli {

void add_backends_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_bench_cp_command(CLI::App& app);  // adds `bench cp` to the `bench` command (after add_bench_command)
void add_bench_generate_command(CLI::App& app);  // `bench generate` (after add_bench_command)
void add_bench_model_command(CLI::App& app);  // adds `bench model` to the `bench` command (after add_bench_command)
void add_bench_train_command(CLI::App& app);  // adds `bench train` to the `bench` command (after add_bench_command)
void add_bench_rollouts_command(CLI::App& app);  // adds `bench rollouts` (after add_bench_command)
void add_attention_check_command(CLI::App& app);
void add_launch_command(CLI::App& app);
void add_init_model_command(CLI::App& app);
void add_logprobs_command(CLI::App& app);
void add_config_command(CLI::App& app);  // config_cmd.cpp
void add_plot_command(CLI::App& app);    // plot_cmd.cpp
void add_train_command(CLI::App& app);   // train_cmd.cpp
void add_export_command(CLI::App& app);  // train_cmd.cpp
void add_grpo_command(CLI::App& app);    // grpo_cmd.cpp

// `logprobs --config FILE`: scoring through the policy worker with the run config's model, mesh and batching.
struct ConfigLogprobsOptions {
  std::string config, data, out, checkpoint;
  std::vector<std::string> overrides;
  bool reference = false;  // score under the config's starting weights
  int timeout_s = 600;
};
// The logprobs in input order on the rank that prints them (rank 0), nullopt on the others. logprobs_config.cpp
std::optional<std::vector<std::vector<float>>> run_config_logprobs(const ConfigLogprobsOptions& o);

// attention-check on GPUs with cp > 1 (one process per GPU): parity against one GPU; returns the exit code.
int gpu_cp_attention_check(const check::AttnProblem& prob, const cp::CpConfig& cfg, int cp, uint64_t seed,
                           std::chrono::milliseconds timeout);
// Prints the errors of a parity check, one line each ("relative error<against>"), then PASS or FAIL.
void print_parity(const check::ParityReport& report, const char* against);

}  // namespace ringtrain::cli
