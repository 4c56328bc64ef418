// ringtrain: the command-line entry point.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "ringtrain/cli/commands.h"
#include "ringtrain/core/error.h"
#include "ringtrain/core/nearest_name.h"
#include "ringtrain/core/sys_error.h"

int main(int argc, char** argv) {
  CLI::App app{"ringtrain: context-parallel training and scoring of transformer policies"};
  app.require_subcommand(1);
  ringtrain::cli::add_backends_command(app);
  ringtrain::cli::add_bench_command(app);
  ringtrain::cli::add_bench_cp_command(app);
  ringtrain::cli::add_bench_model_command(app);
  ringtrain::cli::add_bench_generate_command(app);
  ringtrain::cli::add_bench_train_command(app);
  ringtrain::cli::add_bench_rollouts_command(app);
  ringtrain::cli::add_attention_check_command(app);
  ringtrain::cli::add_launch_command(app);
  ringtrain::cli::add_init_model_command(app);
  ringtrain::cli::add_logprobs_command(app);
  ringtrain::cli::add_config_command(app);
  ringtrain::cli::add_plot_command(app);
  ringtrain::cli::add_train_command(app);
  ringtrain::cli::add_export_command(app);
  ringtrain::cli::add_grpo_command(app);
  // CLI11 would answer a mistyped command with "A subcommand is required"; name it and the command it is nearest.
  if (argc >= 2 && argv[1][0] != '-') {
    std::vector<std::string> names;
    for (const CLI::App* sub : app.get_subcommands({})) names.push_back(sub->get_name());
    const std::string typed = argv[1];
    if (std::find(names.begin(), names.end(), typed) == names.end()) {
      const std::optional<std::string> near = ringtrain::nearest_name(typed, names);
      std::fprintf(stderr, "ringtrain: error: unknown command '%s'%s; `ringtrain --help` lists the commands\n",
                   ringtrain::printable(typed, false).c_str(),
                   near ? ringtrain::cat(" (did you mean '", *near, "'?)").c_str() : "");
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
    ringtrain::check_stdout();  // output lost to a full disk or closed pipe is a failure, not a success
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const ringtrain::cli::Exit& e) {
    if (e.signal != 0) {
      std::fflush(nullptr);
      std::raise(e.signal);  // returns only when the signal is ignored
    }
    return e.code;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ringtrain: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
