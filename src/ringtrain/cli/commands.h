// The ringtrain subcommands. Each file in cli/ adds one; main.cpp lists them.
#pragma once

#include <CLI/CLI.hpp>

namespace ringtrain::cli {

// Thrown by a command to end the program with a given exit code after printing its own message.
struct Exit {
  int code;
};

void add_backends_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_attention_check_command(CLI::App& app);
void add_launch_command(CLI::App& app);
void add_init_model_command(CLI::App& app);
void add_logprobs_command(CLI::App& app);

}  // namespace ringtrain::cli
