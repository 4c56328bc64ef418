// ringtrain: the command-line entry point.
#include <cstdio>

#include "ringtrain/cli/commands.h"
#include "ringtrain/core/error.h"
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
  try {
    app.parse(argc, argv);
    ringtrain::check_stdout();  // output lost to a full disk or closed pipe is a failure, not a success
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const ringtrain::cli::Exit& e) {
    return e.code;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ringtrain: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
