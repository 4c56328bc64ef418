// `ringtrain config` and `ringtrain plot` end to end: exit codes, the printed config reading back equal to the
// library's, errors on stderr naming the key, and an SVG with the metrics' panels.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include "ringtrain/model/file_io.h"
#include "ringtrain/worker/config.h"
#include "ringtrain/worker/metrics.h"
#include "test_util.h"

namespace ringtrain::worker {
namespace {

namespace fs = std::filesystem;
using testing::run_cli;

TEST(WorkerCli, ConfigPrintsTheResolvedConfig) {
  const std::string file = std::string(RINGTRAIN_SOURCE_DIR) + "/configs/grpo.yaml";
  const testing::CliResult r = run_cli(file + " policy.train_micro_batch_size=2 'attention.backends=[math]'");
  ASSERT_NE(r.code, 0);  // no subcommand: usage error
  const testing::CliResult ok =
      run_cli("config " + file + " policy.train_micro_batch_size=2 'attention.backends=[math]'");
  ASSERT_EQ(ok.code, 0) << ok.output;
  const Config printed = parse_config(ok.output, "stdout");
  EXPECT_TRUE(printed == load_config(file, {"policy.train_micro_batch_size=2", "attention.backends=[math]"}));
  EXPECT_EQ(printed.policy.train_micro_batch_size, 2);

  const testing::CliResult bad = run_cli("config " + file + " loss_fn.ratio_clip_mn=0.1");
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.output.find("did you mean 'loss_fn.ratio_clip_min'"), std::string::npos) << bad.output;
  const testing::CliResult heads = run_cli("config " + file + " parallel.cp_comm=a2a parallel.cp=4");
  EXPECT_EQ(heads.code, 1);
  EXPECT_NE(heads.output.find("must both be divisible by cp = 4"), std::string::npos) << heads.output;
  EXPECT_EQ(run_cli("config " + file + " parallel.cp_comm=a2a parallel.cp=4 --no-model").code, 0);
}

// A GRPO run's own checks (its prompts, their room for the responses) are made by `config` too.
TEST(WorkerCli, ConfigChecksAGrpoRunsPrompts) {
  const std::string file = std::string(RINGTRAIN_SOURCE_DIR) + "/configs/grpo_tiny.yaml";
  const testing::CliResult ok = run_cli("config " + file);
  ASSERT_EQ(ok.code, 0) << ok.output;
  EXPECT_EQ(parse_config(ok.output, "stdout").grpo.prompts, "builtin:reverse_digits");
  const testing::CliResult task = run_cli("config " + file + " grpo.prompts=builtin:reverse_word");
  EXPECT_EQ(task.code, 1);
  EXPECT_NE(task.output.find("grpo.prompts = builtin:reverse_word: unknown built-in task"), std::string::npos)
      << task.output;
  const testing::CliResult room = run_cli("config " + file + " grpo.max_new_tokens=4096 --no-model");
  EXPECT_EQ(room.code, 1);
  EXPECT_NE(room.output.find("grpo.max_new_tokens = 4096: prompt"), std::string::npos) << room.output;
}

TEST(WorkerCli, AMistypedCommandIsNamedWithTheNearestOne) {
  const testing::CliResult typo = run_cli("trian --config x.yaml");
  EXPECT_EQ(typo.code, 2);
  EXPECT_NE(typo.output.find("ringtrain: error: unknown command 'trian' (did you mean 'train'?); `ringtrain --help` "
                             "lists the commands"),
            std::string::npos)
      << typo.output;
  const testing::CliResult nonsense = run_cli("qqqqqqqq");
  EXPECT_EQ(nonsense.code, 2);
  EXPECT_NE(nonsense.output.find("unknown command 'qqqqqqqq'; "), std::string::npos) << nonsense.output;
  EXPECT_EQ(run_cli("--help").code, 0);
}

TEST(WorkerCli, PlotWritesAnSvg) {
  const fs::path dir = fs::temp_directory_path() / ("rt_cli_plot_" + std::to_string(::getpid()));
  {
    MetricsWriter w(dir, false);
    for (int64_t step = 1; step <= 5; ++step) w.write(step, {{"loss", 1.0 / step}, {"grad_norm", 0.5 * step}});
  }
  const std::string jsonl = (dir / "metrics.jsonl").string(), svg = (dir / "curves.svg").string();
  const testing::CliResult r = run_cli("plot " + jsonl + " --out " + svg);
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string text = model::read_file(svg);
  EXPECT_NE(text.find("data-metric=\"loss\""), std::string::npos);
  EXPECT_NE(text.find("data-metric=\"grad_norm\""), std::string::npos);
  const testing::CliResult missing = run_cli("plot " + jsonl + " --out " + svg + " --metrics loss,reward");
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.output.find("no metric 'reward' with a finite value (the file has: loss, grad_norm)"),
            std::string::npos)
      << missing.output;
  fs::remove_all(dir);
}

// --data is the one input that may be a pipe (model and config files must be regular files): the same lines give
// the same logprobs from a pipe as from the file.
TEST(WorkerCli, LogprobsReadDataFromAPipe) {
  const fs::path dir = fs::temp_directory_path() / ("rt_cli_pipe_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string ck = (dir / "ck").string(), data = (dir / "data.jsonl").string();
  ASSERT_EQ(run_cli("init-model --out " + ck + " --layers 1 --hidden 16 --heads 2 --ffn 32 --vocab 32").code, 0);
  model::write_file_atomic(data, "{\"input_ids\": [1, 5, 9, 2]}\n{\"input_ids\": [3, 4]}\n");
  const testing::CliResult from_file = run_cli("logprobs --model " + ck + " --data " + data);
  ASSERT_EQ(from_file.code, 0) << from_file.output;
  const testing::CliResult from_pipe = run_cli("logprobs --model " + ck + " --data /dev/stdin", data);
  ASSERT_EQ(from_pipe.code, 0) << from_pipe.output;
  EXPECT_EQ(from_pipe.output, from_file.output);
  EXPECT_NE(from_file.output.find("logprobs"), std::string::npos) << from_file.output;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ringtrain::worker
